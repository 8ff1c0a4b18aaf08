//! The checks of the scenario: after every event (and every worker tick's batch) the
//! touched services' served entries and the touched hosts' pools against the model.

use super::Sim;
use std::time::Instant;

impl Sim<'_> {
    /// Counts an event and checks what it touched (and everything, now and then).
    pub(super) fn check(&mut self) {
        self.report.events += 1;
        if self
            .report
            .events
            .is_multiple_of(u64::from(self.cfg.full_check_every.max(1)))
        {
            self.full_check();
        } else {
            self.check_touched();
        }
    }

    /// Checks every service and every host.
    pub(super) fn full_check(&mut self) {
        self.touched.extend(self.keys.iter().cloned());
        self.touched_hosts.extend(0..self.cfg.hosts);
        self.check_touched();
    }

    /// Compares the entries of the touched services (as the API side serves them, once
    /// everything announced has reached it) and the pools of the touched hosts with the
    /// model; now and then reads one entry over HTTP too.
    fn check_touched(&mut self) {
        let at = Instant::now();
        self.server.block_on(self.api.flushed());
        let touched = std::mem::take(&mut self.touched);
        for key in &touched {
            let served = self.api.entry(key);
            self.model.check_entry(key, served.as_deref());
        }
        for h in std::mem::take(&mut self.touched_hosts) {
            let summary = self.cluster.host_summary(h);
            self.model
                .check_pool(h, summary.get(port_resource::PLUGIN_NAME));
        }
        let http = self
            .report
            .events
            .is_multiple_of(u64::from(self.cfg.http_every.max(1)));
        let readable = touched.iter().find(|k| self.cluster.service(k).is_some());
        if let Some(key) = readable.filter(|_| http) {
            self.report.http_reads += 1;
            match self.server.read(key) {
                Ok(answer) => self.model.check_answer(key, &answer),
                Err(e) => self
                    .model
                    .violations
                    .push(format!("http read of {key}: {e}")),
            }
        }
        self.report.check_total += at.elapsed();
    }

    /// Checks what the last batch (a placement pass, a worker tick) touched, without
    /// counting an event and keeping the touched sets for the event's own check: the
    /// states between the batches of one event are compared with the model too (a
    /// replica placed but not started, or started but not ready, must not be served).
    pub(super) fn check_batch(&mut self) {
        let at = Instant::now();
        self.server.block_on(self.api.flushed());
        for key in &self.touched {
            let served = self.api.entry(key);
            self.model.check_entry(key, served.as_deref());
        }
        for &h in &self.touched_hosts {
            let summary = self.cluster.host_summary(h);
            self.model
                .check_pool(h, summary.get(port_resource::PLUGIN_NAME));
        }
        self.report.check_total += at.elapsed();
    }
}
