//! Issue 7, bad input (scenario 7) and tenancy (scenario 8).
