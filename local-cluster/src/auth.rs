//! Tokens file and bearer authentication.
