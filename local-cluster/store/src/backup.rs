//! The backup file of `xced store backup` / `xced store restore`: every record of a store
//! at one moment (one redb read transaction, one etcd revision), as JSON lines a person
//! can read. The first line says what the file is and how many records follow, so a
//! truncated copy is refused instead of restored in part.

use crate::{Batch, BatchLimit, Key, Op, Store, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The format of the file this version writes (and the newest it reads).
pub const FORMAT: u32 = 1;

/// The first line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The file's format ([`FORMAT`]).
    pub xce_backup: u32,
    /// The records that follow, one per line.
    pub records: usize,
    /// When it was taken (seconds since the Unix epoch).
    pub taken_at: u64,
    /// What it was taken from (`redb`, `etcd`), for the operator.
    pub source: String,
}

/// One record: its key and its value (the store's records are all JSON).
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    ns: String,
    key: String,
    value: Box<serde_json::value::RawValue>,
}

/// Why a backup could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A record's value is not JSON (the store holds something no controller wrote).
    #[error("record {key} is not JSON: {err}")]
    NotJson {
        /// The record.
        key: Key,
        /// Why.
        err: serde_json::Error,
    },
    /// The file is not a backup, or is damaged.
    #[error("line {line} of the backup: {reason}")]
    Bad {
        /// 1-based.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The file was written by a newer version.
    #[error("the backup is format {found}; this xced reads format {FORMAT} and older: restore it with the version that wrote it")]
    Newer {
        /// The file's format.
        found: u32,
    },
    /// The file ends early.
    #[error("the backup is truncated: its header announces {announced} records, it holds {found}")]
    Truncated {
        /// As the header says.
        announced: usize,
        /// As found.
        found: usize,
    },
}

/// The backup file of `records` (as [`Store::load_all`] returned them).
pub fn encode(
    records: &[(Key, Vec<u8>)],
    source: &str,
    taken_at: u64,
) -> Result<Vec<u8>, BackupError> {
    let header = Header {
        xce_backup: FORMAT,
        records: records.len(),
        taken_at,
        source: source.to_owned(),
    };
    let mut out = serde_json::to_vec(&header).expect("a header serializes");
    out.push(b'\n');
    for (key, value) in records {
        let text = std::str::from_utf8(value).map_err(|e| BackupError::NotJson {
            key: key.clone(),
            err: serde::de::Error::custom(e),
        })?;
        let value = serde_json::value::RawValue::from_string(text.to_owned()).map_err(|err| {
            BackupError::NotJson {
                key: key.clone(),
                err,
            }
        })?;
        let line = Line {
            ns: key.ns.clone(),
            key: key.key.clone(),
            value,
        };
        serde_json::to_writer(&mut out, &line).expect("a record serializes");
        out.push(b'\n');
    }
    Ok(out)
}

/// The header and the records of a backup file, checked whole.
pub fn decode(bytes: &[u8]) -> Result<(Header, crate::Records), BackupError> {
    let text = std::str::from_utf8(bytes).map_err(|e| BackupError::Bad {
        line: 1,
        reason: format!("not text: {e}"),
    })?;
    let mut lines = text.lines().enumerate();
    let Some((_, first)) = lines.next() else {
        return Err(BackupError::Bad {
            line: 1,
            reason: "the file is empty".into(),
        });
    };
    let header: Header = serde_json::from_str(first).map_err(|e| BackupError::Bad {
        line: 1,
        reason: format!("not an xce backup header ({e})"),
    })?;
    if header.xce_backup > FORMAT {
        return Err(BackupError::Newer {
            found: header.xce_backup,
        });
    }
    let mut records = Vec::with_capacity(header.records);
    let mut seen = BTreeSet::new();
    for (i, line) in lines {
        let bad = |reason: String| BackupError::Bad {
            line: i + 1,
            reason,
        };
        let l: Line = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        let key = Key::new(l.ns, l.key);
        if !seen.insert(key.clone()) {
            return Err(bad(format!("record {key} appears twice")));
        }
        records.push((key, l.value.get().as_bytes().to_vec()));
    }
    if records.len() != header.records {
        return Err(BackupError::Truncated {
            announced: header.records,
            found: records.len(),
        });
    }
    Ok((header, records))
}

/// Makes `store` hold exactly `records`: every other record removed. `whole`: in one
/// batch (redb: all or nothing, whatever its size); otherwise in batches of the store's
/// limit, removals first (etcd, whose requests are bounded: run it again after a failure).
pub fn replace_all(
    store: &dyn Store,
    records: Vec<(Key, Vec<u8>)>,
    whole: bool,
) -> Result<(), StoreError> {
    let keep: BTreeSet<&Key> = records.iter().map(|(k, _)| k).collect();
    let mut all = Batch::default();
    for (k, _) in store.load_all()? {
        if !keep.contains(&k) {
            all.delete(k);
        }
    }
    for (k, v) in &records {
        all.put(k.clone(), v.clone());
    }
    if whole {
        return store.commit(all);
    }
    for part in split(all, store.batch_limit()) {
        store.commit(part)?;
    }
    Ok(())
}

/// `batch` cut, in order, into batches within `limit` (an operation bigger than the
/// limit goes alone).
fn split(batch: Batch, limit: BatchLimit) -> Vec<Batch> {
    let size = |op: &Op| match op {
        Op::Put(k, v) => k.ns.len() + k.key.len() + v.len(),
        Op::Delete(k) => k.ns.len() + k.key.len(),
    };
    let mut out = Vec::new();
    let (mut cur, mut bytes) = (Batch::default(), 0);
    for op in batch.ops {
        let n = size(&op);
        if !cur.is_empty() && (cur.ops.len() + 1 > limit.ops || bytes + n > limit.bytes) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += n;
        cur.ops.push(op);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemStore;

    fn records() -> Vec<(Key, Vec<u8>)> {
        vec![
            (
                Key::new("job", "j-2"),
                br#"{"info":{"ready":true}}"#.to_vec(),
            ),
            (Key::new("meta", "next_job"), b"21".to_vec()),
        ]
    }

    #[test]
    fn a_backup_reads_back_as_written() {
        let file = encode(&records(), "redb", 7).unwrap();
        let (header, back) = decode(&file).unwrap();
        assert_eq!(header.records, 2);
        assert_eq!(header.source, "redb");
        assert_eq!(back, records());
    }

    #[test]
    fn a_truncated_newer_or_foreign_file_is_refused_saying_why() {
        let file = encode(&records(), "redb", 7).unwrap();
        let cut = &file[..file.len() - 20];
        let cut_at_line = String::from_utf8_lossy(cut);
        let cut_at_line = cut_at_line.rsplit_once('\n').unwrap().0.to_owned() + "\n";
        let e = decode(cut_at_line.as_bytes()).unwrap_err().to_string();
        assert_eq!(
            e,
            "the backup is truncated: its header announces 2 records, it holds 1"
        );
        let newer = String::from_utf8(file.clone()).unwrap().replacen(
            "\"xce_backup\":1",
            "\"xce_backup\":9",
            1,
        );
        let e = decode(newer.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("format 9"), "{e}");
        let e = decode(b"hello\n").unwrap_err().to_string();
        assert!(
            e.starts_with("line 1 of the backup: not an xce backup header"),
            "{e}"
        );
    }

    #[test]
    fn replace_all_leaves_exactly_the_backup_in_batches_or_whole() {
        for whole in [true, false] {
            let store = MemStore::new();
            let mut b = Batch::default();
            b.put(Key::new("job", "j-3"), b"{}".to_vec());
            b.put(Key::new("meta", "next_job"), b"30".to_vec());
            store.commit(b).unwrap();
            replace_all(&store, records(), whole).unwrap();
            assert_eq!(store.load_all().unwrap(), records(), "whole: {whole}");
        }
        let limit = BatchLimit {
            ops: 2,
            bytes: 1 << 20,
        };
        let mut b = Batch::default();
        for (k, v) in records().into_iter().chain(records()) {
            b.put(k, v);
        }
        let parts: Vec<usize> = split(b, limit).iter().map(|p| p.ops.len()).collect();
        assert_eq!(parts, vec![2, 2]);
    }
}
