//! Which masters a cluster has, which slots each serves, and direct
//! connections to one node (for what a cluster connection does not route:
//! `SCAN`, `CONFIG GET`, `INFO` of one master).

use std::time::Duration;

use redis::Value;

use crate::error::{Error, Result};
use crate::slot::key_slot;

/// One master as `CLUSTER SLOTS` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Master {
    /// `host:port`.
    pub addr: String,
    /// The node id (40 hex digits).
    pub id: String,
    /// Inclusive slot ranges.
    pub slots: Vec<(u16, u16)>,
    /// The replicas' `host:port`.
    pub replicas: Vec<String>,
}

impl Master {
    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// The masters of a cluster, as one node saw them.
#[derive(Clone, Debug)]
pub struct Topology {
    /// In the order of their first slot.
    pub masters: Vec<Master>,
}

impl Topology {
    /// The topology from the first of `seeds` (`redis://host:port` or
    /// `host:port`) that answers `CLUSTER SLOTS`.
    pub fn fetch(seeds: &[String], timeout: Duration) -> Result<Topology> {
        let mut last = None;
        for seed in seeds {
            match connect(seed, timeout).and_then(|mut c| {
                let v: Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut c)?;
                parse_slots(&v)
            }) {
                Ok(t) => return Ok(t),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::BadOption("no cluster URL given".into())))
    }

    /// The master serving `slot`.
    pub fn master_of_slot(&self, slot: u16) -> Option<&Master> {
        self.masters.iter().find(|m| m.serves(slot))
    }

    /// The master serving `key`'s slot.
    pub fn master_of_key(&self, key: &[u8]) -> Option<&Master> {
        self.master_of_slot(key_slot(key))
    }

    /// Slots that no master serves.
    pub fn uncovered(&self) -> usize {
        let served: usize = self
            .masters
            .iter()
            .flat_map(|m| m.slots.iter())
            .map(|&(a, b)| usize::from(b - a) + 1)
            .sum();
        usize::from(crate::slot::SLOTS).saturating_sub(served)
    }
}

/// A connection to one node, with `timeout` on connecting, reading and
/// writing. `node` is `redis://host:port` or `host:port`.
pub fn connect(node: &str, timeout: Duration) -> Result<redis::Connection> {
    let url = if node.contains("://") {
        node.to_string()
    } else {
        format!("redis://{node}")
    };
    let c = redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
    c.set_read_timeout(Some(timeout))?;
    c.set_write_timeout(Some(timeout))?;
    Ok(c)
}

/// The seed URLs of a `--cluster` argument: `redis://H:P[,H:P...]`, each
/// element with or without its `redis://`, as `redis://host:port`. Any seed
/// will do (the client learns the rest of the cluster from it); more than
/// one lets a mount start while one node is down.
pub fn seeds(spec: &str) -> Result<Vec<String>> {
    let bad = |why: String| Error::BadOption(format!("--cluster {spec:?}: {why}"));
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim) {
        let addr = match part.split_once("://") {
            Some(("redis", rest)) => rest,
            Some((scheme, _)) => return Err(bad(format!("{scheme}:// is not redis://"))),
            None => part,
        };
        let Some((host, port)) = addr.rsplit_once(':') else {
            return Err(bad(format!("{part:?} has no :port")));
        };
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(bad(format!("{part:?} is not host:port")));
        }
        out.push(format!("redis://{host}:{port}"));
    }
    debug_assert!(!out.is_empty(), "split yields at least one part");
    Ok(out)
}

/// `host:port` of a `redis://host:port[/db]` URL (or of `host:port`).
pub fn addr_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

fn parse_slots(v: &Value) -> Result<Topology> {
    let bad = |what: &str| Error::Protocol(format!("CLUSTER SLOTS: {what}"));
    let Value::Array(ranges) = v else {
        return Err(bad("not an array"));
    };
    let mut masters: Vec<Master> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(bad("a range is not an array"));
        };
        let [start, end, master, replicas @ ..] = parts.as_slice() else {
            return Err(bad("a range is short"));
        };
        let (start, end) = (slot_number(start)?, slot_number(end)?);
        let (addr, id) = node_of(master)?;
        let replicas = replicas
            .iter()
            .map(|r| node_of(r).map(|(a, _)| a))
            .collect::<Result<Vec<_>>>()?;
        match masters.iter_mut().find(|m| m.id == id) {
            Some(m) => m.slots.push((start, end)),
            None => masters.push(Master {
                addr,
                id,
                slots: vec![(start, end)],
                replicas,
            }),
        }
    }
    for m in &mut masters {
        m.slots.sort_unstable();
        m.replicas.sort();
    }
    masters.sort_by_key(|m| m.slots.first().map_or(0, |s| s.0));
    Ok(Topology { masters })
}

fn slot_number(v: &Value) -> Result<u16> {
    match v {
        Value::Int(n) if (0..i64::from(crate::slot::SLOTS)).contains(n) => Ok(*n as u16),
        _ => Err(Error::Protocol(format!("CLUSTER SLOTS: bad slot {v:?}"))),
    }
}

/// `(host:port, id)` of a node entry `[ip, port, id, ...]`.
fn node_of(v: &Value) -> Result<(String, String)> {
    let bad = || Error::Protocol(format!("CLUSTER SLOTS: bad node {v:?}"));
    let Value::Array(f) = v else {
        return Err(bad());
    };
    let (Some(ip), Some(Value::Int(port)), Some(id)) = (f.first(), f.get(1), f.get(2)) else {
        return Err(bad());
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| bad()),
        Value::SimpleString(s) => Ok(s.clone()),
        _ => Err(bad()),
    };
    Ok((format!("{}:{port}", text(ip)?), text(id)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(addr_of("redis://127.0.0.1:7000"), "127.0.0.1:7000");
        assert_eq!(
            seeds("redis://127.0.0.1:7000, 127.0.0.1:7001").unwrap(),
            ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]
        );
        for bad in [
            "",
            "redis://",
            "127.0.0.1",
            "h:0",
            "h:x",
            ":7000",
            "http://h:1",
            "a:1,",
        ] {
            assert!(seeds(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(addr_of("redis://127.0.0.1:7000/0"), "127.0.0.1:7000");
        assert_eq!(addr_of("127.0.0.1:7000"), "127.0.0.1:7000");
    }

    #[test]
    fn parses_cluster_slots() {
        let node = |port: i64, id: &str| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(id.as_bytes().to_vec()),
            ])
        };
        let v = Value::Array(vec![
            Value::Array(vec![Value::Int(8192), Value::Int(16383), node(2, "b")]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(100),
                node(1, "a"),
                node(3, "c"),
            ]),
            Value::Array(vec![Value::Int(101), Value::Int(8191), node(1, "a")]),
        ]);
        let t = parse_slots(&v).unwrap();
        assert_eq!(t.masters.len(), 2);
        assert_eq!(t.masters[0].addr, "127.0.0.1:1");
        assert_eq!(t.masters[0].slots, vec![(0, 100), (101, 8191)]);
        assert_eq!(t.masters[0].replicas, vec!["127.0.0.1:3".to_string()]);
        assert_eq!(t.master_of_slot(9000).unwrap().id, "b");
        assert_eq!(t.uncovered(), 0);
        assert!(parse_slots(&Value::Int(1)).is_err());
    }
}
