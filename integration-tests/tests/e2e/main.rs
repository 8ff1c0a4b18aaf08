//! One test binary for every end-to-end test (faster to build on a 2-core machine).
#![allow(unreachable_pub, missing_docs)]

mod daemons;
mod external;
mod harness;

mod address;
mod allstream;
mod causes;
mod cliwatch;
mod dev;
mod etcd_txn;
mod failover;
mod faults_rollout;
mod fulldisk;
mod ha;
mod http2;
mod identity;
mod leadership;
mod pause;
mod prometheus;
mod reliability;
mod reliability_flood;
mod reliability_hostile;
mod reliability_input;
mod reliability_tenants;
mod reliability_watch;
mod restart;
mod rollout;
mod rotation;
mod scale;
mod shutdown;
mod tls;
mod ui;
