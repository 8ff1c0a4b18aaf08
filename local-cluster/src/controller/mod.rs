//! The controller: cluster state, the scheduler, and the apiserver's host routes.
