//! The controller's persistent store.
