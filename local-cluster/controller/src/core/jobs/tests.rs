use super::*;
use plugin_api::JobState;
use std::collections::BTreeMap;

/// A job view of replica `replica`, id `id`; `tag` tells two versions of one job apart.
fn view(replica: u32, id: &str, tag: bool) -> JobView {
    JobView {
        rec: Arc::new(JobRec {
            info: JobInfo {
                job: id.to_owned(),
                service: "s".into(),
                project: "p".into(),
                replica,
                host: "h".into(),
                state: JobState::Running,
                ready: tag,
                grants: plugin_api::Grants::new(),
                generation: 1,
            },
            held: None,
            held_ready: None,
            log: None,
        }),
        summaries: None,
    }
}

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Patches of every size (one job, a burst, most of the jobs), inserts, updates and
/// removals, against a plain sorted list: the same jobs in the same order, every chunk
/// within its bounds, `get` and `of_replica` finding what a scan finds.
#[test]
fn patches_give_the_jobs_a_sorted_list_has() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // The model: by (replica, id) -> the version's tag.
    let mut model: BTreeMap<(u32, u64, String), bool> = BTreeMap::new();
    let mut jobs = Jobs::default();
    for round in 0..400 {
        let size = match round % 10 {
            0 => 1 + rng.below(2_000),
            1..=3 => 1 + rng.below(300),
            _ => 1 + rng.below(4),
        };
        let mut changes: BTreeMap<(u32, u64, String), Option<JobView>> = BTreeMap::new();
        for _ in 0..size {
            let remove = model.len() > 3_000 || (round % 50 > 40 && !model.is_empty());
            let (replica, id) = if remove || (!model.is_empty() && rng.below(3) == 0) {
                let at = rng.below(model.len() as u64) as usize;
                let (r, _, id) = model.keys().nth(at).unwrap().clone();
                (r, id)
            } else if rng.below(20) == 0 {
                // An id that is not `j-<n>`: sorted after the numbered ones, by id.
                (rng.below(50) as u32, format!("x{}", rng.below(1_000)))
            } else {
                (rng.below(50) as u32, format!("j-{}", rng.below(100_000)))
            };
            let key = (replica, job_num(&id), id.clone());
            let new = (!remove && rng.below(4) != 0).then(|| view(replica, &id, round % 2 == 0));
            changes.insert(key, new);
        }
        for (key, new) in &changes {
            match new {
                Some(v) => model.insert(key.clone(), v.info().ready),
                None => model.remove(key),
            };
        }
        let changes: Vec<((u32, String), Option<JobView>)> = changes
            .into_iter()
            .map(|((r, _, id), v)| ((r, id), v))
            .collect();
        jobs = jobs.patch(&changes);
        jobs.check();
        let want: Vec<(u32, &str, bool)> = model
            .iter()
            .map(|((r, _, id), tag)| (*r, id.as_str(), *tag))
            .collect();
        let got: Vec<(u32, &str, bool)> = jobs
            .iter()
            .map(|j| (j.info().replica, j.info().job.as_str(), j.info().ready))
            .collect();
        assert_eq!(got, want, "round {round}");
        assert_eq!(jobs.len(), model.len());
        let whole = Jobs::from_sorted(jobs.iter().cloned().collect());
        whole.check();
        assert_eq!(whole, jobs, "equal however chunked");
        for r in [0, rng.below(50) as u32, 49] {
            let scan: Vec<&JobView> = jobs.iter().filter(|j| j.info().replica == r).collect();
            assert_eq!(jobs.of_replica(r).collect::<Vec<_>>(), scan, "replica {r}");
            for j in scan {
                assert!(std::ptr::eq(jobs.get(order(j.info())).unwrap(), j));
            }
        }
    }
}

#[test]
fn a_patch_copies_only_the_chunks_it_changes() {
    let all: Vec<JobView> = (0..10_000)
        .map(|n| view(n, &format!("j-{n}"), true))
        .collect();
    let jobs = Jobs::from_sorted(all);
    let changes = [(
        (5_000u32, "j-5000".to_owned()),
        Some(view(5_000, "j-5000", false)),
    )];
    let patched = jobs.patch(&changes);
    patched.check();
    let shared = jobs
        .chunks
        .iter()
        .zip(&patched.chunks)
        .filter(|(a, b)| Arc::ptr_eq(a, b))
        .count();
    assert_eq!(patched.chunks.len(), jobs.chunks.len());
    assert_eq!(shared, jobs.chunks.len() - 1, "one chunk copied");
    assert!(!patched.get(key_of(5_000, "j-5000")).unwrap().info().ready);
}
