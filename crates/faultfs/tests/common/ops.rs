//! Seeded random operations through real system calls on a mount, each
//! applied to a model of the root directory as soon as it is acknowledged.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use super::Rng;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    File(Vec<u8>),
    Dir,
}

pub type Tree = BTreeMap<String, Node>;

pub fn read_tree(root: &Path) -> Tree {
    let mut t = Tree::new();
    for e in std::fs::read_dir(root).expect("readdir on the memfs mount") {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let node = if e.file_type().unwrap().is_dir() {
            Node::Dir
        } else {
            Node::File(std::fs::read(e.path()).expect("read a file on the memfs mount"))
        };
        t.insert(name, node);
    }
    t
}

pub fn describe(t: &Tree) -> String {
    t.iter()
        .map(|(k, v)| match v {
            Node::Dir => format!("{k}/"),
            Node::File(d) => format!("{k}:{}", d.len()),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn content(rng: &mut Rng) -> Vec<u8> {
    // Up to 96 KiB: one write(2) is one FUSE request, so it is atomic.
    let len = 1 + rng.below(96 << 10) as usize;
    let b = rng.next() as u8;
    (0..len).map(|i| b.wrapping_add((i / 7) as u8)).collect()
}

/// The first error of an operation: the model just before the failing call
/// and the model had it succeeded.
pub struct Failed {
    pub err: std::io::Error,
    pub before: Tree,
    pub would: Tree,
}

/// One mutation as a sequence of system calls, each applied to `model` as
/// soon as it is acknowledged.
pub fn step(root: &Path, model: &mut Tree, rng: &mut Rng, n: u64) -> Result<(), Failed> {
    let files: Vec<String> = model
        .iter()
        .filter(|(_, v)| matches!(v, Node::File(_)))
        .map(|(k, _)| k.clone())
        .collect();
    let pick = |rng: &mut Rng| files[rng.below(files.len() as u64) as usize].clone();
    let choice = if files.is_empty() { 0 } else { rng.below(10) };
    let before = model.clone();
    let fail = |err: std::io::Error, before: &Tree, change: &dyn Fn(&mut Tree)| {
        let mut would = before.clone();
        change(&mut would);
        Err(Failed {
            err,
            before: before.clone(),
            would,
        })
    };
    match choice {
        // Create a new file and write it.
        0..=3 => {
            let name = format!("f{n}");
            let data = content(rng);
            let mut f = match std::fs::File::create_new(root.join(&name)) {
                Ok(f) => f,
                Err(e) => {
                    return fail(e, &before, &|t| {
                        t.insert(name.clone(), Node::File(Vec::new()));
                    });
                }
            };
            model.insert(name.clone(), Node::File(Vec::new()));
            let at = model.clone();
            match f.write(&data) {
                Ok(k) => {
                    model.insert(name, Node::File(data[..k].to_vec()));
                }
                Err(e) => {
                    return fail(e, &at, &|t| {
                        t.insert(name.clone(), Node::File(data.clone()));
                    });
                }
            }
        }
        // Overwrite an existing file: O_TRUNC, then one write.
        4..=5 => {
            let name = pick(rng);
            let data = content(rng);
            let mut f = match std::fs::File::options()
                .write(true)
                .truncate(true)
                .open(root.join(&name))
            {
                Ok(f) => f,
                Err(e) => {
                    return fail(e, &before, &|t| {
                        t.insert(name.clone(), Node::File(Vec::new()));
                    });
                }
            };
            model.insert(name.clone(), Node::File(Vec::new()));
            let at = model.clone();
            match f.write(&data) {
                Ok(k) => {
                    model.insert(name, Node::File(data[..k].to_vec()));
                }
                Err(e) => {
                    return fail(e, &at, &|t| {
                        t.insert(name.clone(), Node::File(data.clone()));
                    });
                }
            }
        }
        6 => {
            let name = pick(rng);
            if let Err(e) = std::fs::remove_file(root.join(&name)) {
                return fail(e, &before, &|t| {
                    t.remove(&name);
                });
            }
            model.remove(&name);
        }
        7 => {
            let from = pick(rng);
            let to = format!("r{n}");
            if let Err(e) = std::fs::rename(root.join(&from), root.join(&to)) {
                return fail(e, &before, &|t| {
                    let v = t.remove(&from).unwrap();
                    t.insert(to.clone(), v);
                });
            }
            let v = model.remove(&from).unwrap();
            model.insert(to, v);
        }
        _ => {
            let name = format!("d{n}");
            if let Err(e) = std::fs::create_dir(root.join(&name)) {
                return fail(e, &before, &|t| {
                    t.insert(name.clone(), Node::Dir);
                });
            }
            model.insert(name, Node::Dir);
        }
    }
    Ok(())
}

pub fn assert_tree(root: &Path, want: &Tree, what: &str) {
    let got = read_tree(root);
    assert!(
        got == *want,
        "{what}: the tree differs from the acknowledged model\n got: {}\nwant: {}",
        describe(&got),
        describe(want)
    );
}
