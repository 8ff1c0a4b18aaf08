//! The worker agent.
