//! Router and socket tests.
