//! Per-project quotas (docs/design.md#isolation): how many services, replicas and plugin quantities
//! (e.g. ports) one project may declare, so one tenant cannot use up every host.
//!
//! Pure: the core computes a project's use before and after a change and asks `check`.
//! Use is what the profiles declare (`replicas` × what one replica takes), not what runs
//! at the moment: a rollout's surge replicas and draining ones do not count, so a rollout
//! never fails on a quota its service already fits.

use plugin_api::FieldError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// The quota names every host knows; plugins add their quantities (e.g. `ports`).
pub const SERVICES: &str = "services";
/// See [`SERVICES`].
pub const REPLICAS: &str = "replicas";

/// Limits by quota name (`services`, `replicas`, or a plugin quantity such as `ports`).
pub type Limits = BTreeMap<String, u64>;

/// The quotas of the controller config: `[quotas.default]` for every project without a
/// section of its own, `[quotas."team-a"]` for one project.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quotas {
    projects: BTreeMap<String, Limits>,
}

impl Quotas {
    /// Reads `[quotas]` (a table of tables of non-negative integers), naming every
    /// problem. `known` lists the quota names besides `services` and `replicas` (the
    /// plugins' quantities); anything else is a problem, not a silently unlimited typo.
    pub fn parse(v: &Value, known: &[&str]) -> Result<Self, Vec<FieldError>> {
        let mut errs = Vec::new();
        let mut projects = BTreeMap::new();
        let Some(top) = v.as_object() else {
            return Err(vec![FieldError::new(
                "quotas",
                "must be a table of projects",
            )]);
        };
        for (project, limits) in top {
            let at = format!("quotas.{}", quoted(project));
            let Some(limits) = limits.as_object() else {
                errs.push(FieldError::new(at, "must be a table of limits"));
                continue;
            };
            let mut out = Limits::new();
            for (name, n) in limits {
                let field = format!("{at}.{name}");
                if ![SERVICES, REPLICAS].contains(&name.as_str()) && !known.contains(&name.as_str())
                {
                    let mut all = vec![SERVICES, REPLICAS];
                    all.extend_from_slice(known);
                    errs.push(FieldError::new(
                        field,
                        format!("unknown quota (known: {})", all.join(", ")),
                    ));
                    continue;
                }
                match n.as_u64() {
                    Some(n) => {
                        out.insert(name.clone(), n);
                    }
                    None => errs.push(FieldError::new(
                        field,
                        format!("must be a non-negative integer, not {n}"),
                    )),
                }
            }
            projects.insert(project.clone(), out);
        }
        if errs.is_empty() {
            Ok(Quotas { projects })
        } else {
            Err(errs)
        }
    }

    /// The limits that apply to `project`, if any.
    pub fn of(&self, project: &str) -> Option<&Limits> {
        self.projects
            .get(project)
            .or_else(|| self.projects.get("default"))
    }

    /// Whether any quota is configured.
    pub fn is_empty(&self) -> bool {
        self.projects.is_empty()
    }
}

fn quoted(project: &str) -> String {
    if project
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        project.to_owned()
    } else {
        format!("{project:?}")
    }
}

/// What a project declares: `services`, `replicas` and every plugin quantity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Use(pub(crate) BTreeMap<String, u64>);

impl Use {
    /// Adds one service of `replicas` replicas, each taking `quantities`.
    pub(crate) fn add(&mut self, replicas: u32, quantities: &BTreeMap<String, u64>) {
        *self.0.entry(SERVICES.to_owned()).or_default() += 1;
        *self.0.entry(REPLICAS.to_owned()).or_default() += u64::from(replicas);
        for (k, n) in quantities {
            *self.0.entry(k.clone()).or_default() += n * u64::from(replicas);
        }
    }

    /// Adds one service (no replicas).
    pub(crate) fn add_service(&mut self) {
        *self.0.entry(SERVICES.to_owned()).or_default() += 1;
    }

    /// Adds one running replica taking `quantities`.
    pub(crate) fn add_replica(&mut self, quantities: &BTreeMap<String, u64>) {
        *self.0.entry(REPLICAS.to_owned()).or_default() += 1;
        for (k, n) in quantities {
            *self.0.entry(k.clone()).or_default() += n;
        }
    }

    fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }
}

/// The use before and after a change, counting what is held beyond what profiles declare
/// (draining replicas, a surge, services still stopping): before, the larger of declared
/// and held; after, what the change declares plus that excess, which the change does not
/// free.
pub(crate) fn with_held(before: &Use, after: &Use, held: &Use) -> (Use, Use) {
    let mut b = Use::default();
    let mut a = Use::default();
    let keys: std::collections::BTreeSet<&String> = before
        .0
        .keys()
        .chain(after.0.keys())
        .chain(held.0.keys())
        .collect();
    for k in keys {
        let excess = held.get(k).saturating_sub(before.get(k));
        b.0.insert(k.clone(), before.get(k).max(held.get(k)));
        a.0.insert(k.clone(), after.get(k) + excess);
    }
    (b, a)
}

/// A change that would take a project past a quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// The project.
    pub project: String,
    /// The quota's name.
    pub quota: String,
    /// Its limit.
    pub limit: u64,
    /// The project's use now.
    pub used: u64,
    /// Its use after the change.
    pub wanted: u64,
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "project {:?} would use {} {} of its quota of {} ({} in use)",
            self.project, self.wanted, self.quota, self.limit, self.used
        )
    }
}

/// Refuses a change that raises a use past its limit. A use that only goes down (or
/// stays) passes even above the limit, so a project over a lowered quota can still
/// scale down or stop.
pub(crate) fn check(
    project: &str,
    limits: &Limits,
    before: &Use,
    after: &Use,
) -> Result<(), Exceeded> {
    for (quota, &limit) in limits {
        let (used, wanted) = (before.get(quota), after.get(quota));
        if wanted > used && wanted > limit {
            return Err(Exceeded {
                project: project.to_owned(),
                quota: quota.clone(),
                limit,
                used,
                wanted,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bad_quotas_are_listed_together() {
        let v = json!({"default": {"services": -1, "replicas": "ten", "prots": 3},
                       "team-a": 5, "team-b": {"ports": 64}});
        let errs: Vec<String> = Quotas::parse(&v, &["ports"])
            .unwrap_err()
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(
            errs,
            vec![
                "quotas.default.prots: unknown quota (known: services, replicas, ports)",
                "quotas.default.replicas: must be a non-negative integer, not \"ten\"",
                "quotas.default.services: must be a non-negative integer, not -1",
                "quotas.\"team-a\": must be a table of limits",
            ]
        );
    }

    #[test]
    fn a_project_without_a_section_gets_the_default() {
        let q = Quotas::parse(
            &json!({"default": {"replicas": 10}, "team-a": {"replicas": 2}}),
            &[],
        )
        .unwrap();
        assert_eq!(q.of("team-a").unwrap()[REPLICAS], 2);
        assert_eq!(q.of("team-b").unwrap()[REPLICAS], 10);
        assert!(Quotas::default().of("x").is_none());
    }

    #[test]
    fn replicas_still_draining_count_until_they_are_gone() {
        let ports = BTreeMap::from([("ports".to_owned(), 2)]);
        let limits: Limits = [("ports".to_owned(), 6)].into();
        // Scaled 3 -> 1: declared 2 ports, but the two draining replicas still hold 4.
        let mut declared = Use::default();
        declared.add(1, &ports);
        let mut held = Use::default();
        held.add_service();
        for _ in 0..3 {
            held.add_replica(&ports);
        }
        let mut up = Use::default();
        up.add(3, &ports);
        let (b, a) = with_held(&declared, &up, &held);
        let e = check("team-a", &limits, &b, &a).unwrap_err();
        assert_eq!((e.used, e.wanted), (6, 10));
        // Once they are gone, scaling up to 3 fits again.
        let mut held = Use::default();
        held.add_service();
        held.add_replica(&ports);
        let (b, a) = with_held(&declared, &up, &held);
        assert!(check("team-a", &limits, &b, &a).is_ok());
    }

    #[test]
    fn only_a_rise_past_the_limit_is_refused() {
        let limits: Limits = [(REPLICAS.to_owned(), 4), ("ports".to_owned(), 8)].into();
        let ports = BTreeMap::from([("ports".to_owned(), 2)]);
        let mut before = Use::default();
        before.add(4, &ports);
        let mut more = Use::default();
        more.add(5, &ports);
        let e = check("team-a", &limits, &before, &more).unwrap_err();
        assert_eq!(
            e.to_string(),
            "project \"team-a\" would use 10 ports of its quota of 8 (8 in use)"
        );
        let mut less = Use::default();
        less.add(3, &ports);
        // Above a lowered limit, going down is fine.
        let tight: Limits = [(REPLICAS.to_owned(), 1)].into();
        assert!(check("team-a", &tight, &before, &less).is_ok());
    }
}
