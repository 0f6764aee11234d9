//! The shell's commands, each over the engine's public API.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use memfs_fs::{
    Attr, Ctx, Errno, FileType, Fs, ROOT_INO, RenameFlags, SetAttr, SetTime, XattrMode,
};

use crate::human;

use super::format::{format_time, ls_line_with, mode_string, name_str};
use super::{CmdResult, Shell, err, fs_err};

/// One command's help entry.
pub struct Spec {
    pub name: &'static str,
    pub usage: &'static str,
    pub summary: &'static str,
    pub details: &'static str,
}

pub const COMMANDS: &[Spec] = &[
    Spec {
        name: "create",
        usage: "create [-n N] FILE...",
        summary: "create empty files",
        details: "Fails for a name that already exists. With -n N the N files are created in parallel on worker threads; N must equal the number of names.",
    },
    Spec {
        name: "write",
        usage: "write [-n N] [--at OFFSET] FILE TEXT [FILE TEXT...]",
        summary: "append text to files (created if missing)",
        details: "Appends TEXT to FILE; with --at OFFSET writes it at that byte offset instead, overwriting. With -n N the N pairs are written in parallel; N must equal the number of files.",
    },
    Spec {
        name: "read",
        usage: "read FILE...",
        summary: "print files (alias: cat)",
        details: "Prints the contents; a newline is added if the file does not end with one.",
    },
    Spec {
        name: "delete",
        usage: "delete [-n N] FILE...",
        summary: "delete files (alias: rm)",
        details: "Removes files, symlinks and other non-directories (use rmdir for directories). With -n N in parallel; N must equal the number of names.",
    },
    Spec {
        name: "ls",
        usage: "ls [-l] [-a] [PATH...]",
        summary: "list directory contents",
        details: "-l shows type and mode, links, owner, group, size, modification time; -a also lists . and ..",
    },
    Spec {
        name: "mkdir",
        usage: "mkdir [-p] DIR...",
        summary: "create directories",
        details: "-p creates missing parents and accepts existing directories.",
    },
    Spec {
        name: "rmdir",
        usage: "rmdir DIR...",
        summary: "remove empty directories",
        details: "",
    },
    Spec {
        name: "cd",
        usage: "cd [DIR]",
        summary: "change the current directory (default /)",
        details: "",
    },
    Spec {
        name: "pwd",
        usage: "pwd",
        summary: "print the current directory",
        details: "",
    },
    Spec {
        name: "mv",
        usage: "mv SOURCE... DEST",
        summary: "move or rename",
        details: "With several sources, or when DEST is a directory, the sources are moved into DEST.",
    },
    Spec {
        name: "cp",
        usage: "cp [-r] SOURCE... DEST",
        summary: "copy files (-r: directories too)",
        details: "Copies contents, mode and extended attributes; inside a recursive copy, symlinks are copied as symlinks.",
    },
    Spec {
        name: "ln",
        usage: "ln [-s] TARGET LINK",
        summary: "make a hard link (-s: a symbolic link)",
        details: "",
    },
    Spec {
        name: "stat",
        usage: "stat PATH...",
        summary: "show a node's attributes",
        details: "",
    },
    Spec {
        name: "truncate",
        usage: "truncate -s SIZE FILE...",
        summary: "set file sizes (created if missing)",
        details: "SIZE takes suffixes: 10K, 4MiB, 1G.",
    },
    Spec {
        name: "chmod",
        usage: "chmod MODE PATH...",
        summary: "change permission bits (octal MODE, e.g. 644)",
        details: "",
    },
    Spec {
        name: "touch",
        usage: "touch FILE...",
        summary: "update times, creating missing files",
        details: "",
    },
    Spec {
        name: "tree",
        usage: "tree [PATH]",
        summary: "show a directory tree",
        details: "",
    },
    Spec {
        name: "du",
        usage: "du [PATH...]",
        summary: "space used under paths",
        details: "Prints allocated bytes, apparent size and the path; hard links count once.",
    },
    Spec {
        name: "df",
        usage: "df",
        summary: "capacity and usage of the file system",
        details: "",
    },
    Spec {
        name: "find",
        usage: "find [DIR] NAME-PATTERN",
        summary: "find names matching a pattern",
        details: "The pattern is a glob on the last component (*, ?, [abc], [a-z], [!x]); quote it. DIR defaults to the current directory.",
    },
    Spec {
        name: "import",
        usage: "import HOSTPATH [PATH]",
        summary: "copy a host file or directory tree in",
        details: "Recursive. Copies regular files, directories and symlinks with their modes. PATH defaults to the current directory.",
    },
    Spec {
        name: "export",
        usage: "export PATH HOSTPATH",
        summary: "copy a file or directory tree out to the host",
        details: "Recursive. Copies regular files, directories and symlinks with their modes.",
    },
    Spec {
        name: "xattr",
        usage: "xattr get PATH NAME | set PATH NAME VALUE | list PATH | rm PATH NAME",
        summary: "extended attributes",
        details: "Names need a namespace prefix, e.g. user.comment.",
    },
    Spec {
        name: "log",
        usage: "log [-n COUNT]",
        summary: "recent commits (needs --data-dir)",
        details: "",
    },
    Spec {
        name: "snapshot",
        usage: "snapshot create NAME | list | delete NAME",
        summary: "named copy-on-write snapshots, browsable in .snapshots/NAME",
        details: "Instant: a snapshot shares every page and directory with the live tree\n\
                  and grows only with later changes. With --data-dir it is also a pinned\n\
                  commit that survives restarts (browsable until the session reopens).",
    },
    Spec {
        name: "rollback",
        usage: "rollback --to SNAPSHOT",
        summary: "make the live tree the snapshot's again",
        details: "Without --data-dir the switch is in place and keeps every snapshot;\n\
                  with one, the data directory is rolled back (later snapshots go).",
    },
    Spec {
        name: "diff",
        usage: "diff SNAPSHOT [SNAPSHOT | -]",
        summary: "paths created (+), deleted (-), modified (M), renamed (R) between two states",
        details: "- (the default second side) is the live tree.",
    },
    Spec {
        name: "help",
        usage: "help [COMMAND]",
        summary: "list commands, or describe one",
        details: "",
    },
    Spec {
        name: "clear",
        usage: "clear",
        summary: "clear the screen",
        details: "",
    },
    Spec {
        name: "exit",
        usage: "exit [STATUS]",
        summary: "leave the shell (alias: quit; Ctrl-D also works)",
        details: "",
    },
];

const ALIASES: &[(&str, &str)] = &[("cat", "read"), ("rm", "delete"), ("quit", "exit")];

/// Every name the completer offers for the first word.
pub fn command_names() -> impl Iterator<Item = &'static str> {
    COMMANDS
        .iter()
        .map(|s| s.name)
        .chain(ALIASES.iter().map(|a| a.0))
}

fn spec(name: &str) -> Option<&'static Spec> {
    let name = ALIASES.iter().find(|a| a.0 == name).map_or(name, |a| a.1);
    COMMANDS.iter().find(|s| s.name == name)
}

/// Parsed options of one command: flags, flag values and operands.
struct Opts {
    flags: Vec<(&'static str, Option<String>)>,
    operands: Vec<String>,
}

impl Opts {
    /// `known` lists the options as `("-l", false)` or `("--at", true)` (takes a value).
    fn parse(args: &[String], known: &[(&'static str, bool)]) -> Result<Opts, super::CmdError> {
        let mut flags = Vec::new();
        let mut operands = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--" {
                operands.extend(it.by_ref().cloned());
                break;
            }
            if a.len() > 1 && a.starts_with('-') {
                let (name, inline) = match a.split_once('=') {
                    Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                    _ => (a.as_str(), None),
                };
                let Some(&(flag, takes)) = known.iter().find(|k| k.0 == name) else {
                    return err(format!("unknown option: {a}"));
                };
                let value = if takes {
                    match inline.or_else(|| it.next().cloned()) {
                        Some(v) => Some(v),
                        None => return err(format!("option {flag} needs a value")),
                    }
                } else {
                    None
                };
                flags.push((flag, value));
            } else {
                operands.push(a.clone());
            }
        }
        Ok(Opts { flags, operands })
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f.0 == flag)
    }

    fn value(&self, flag: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|f| f.0 == flag)
            .and_then(|f| f.1.as_deref())
    }
}

fn usage<T>(cmd: &str) -> Result<T, super::CmdError> {
    let u = spec(cmd).map_or("", |s| s.usage);
    err(format!("usage: {u}"))
}

pub fn dispatch(sh: &mut Shell, words: &[String]) -> CmdResult {
    let name = words[0].as_str();
    let args = &words[1..];
    let Some(spec) = spec(name) else {
        return err("unknown command (type help for the list)");
    };
    set_current(name);
    match spec.name {
        "create" => create(sh, args),
        "write" => write(sh, args),
        "read" => read(sh, args),
        "delete" => delete(sh, args),
        "ls" => ls(sh, args),
        "mkdir" => mkdir(sh, args),
        "rmdir" => rmdir(sh, args),
        "cd" => cd(sh, args),
        "pwd" => pwd(sh, args),
        "mv" => mv(sh, args),
        "cp" => cp(sh, args),
        "ln" => ln(sh, args),
        "stat" => stat(sh, args),
        "truncate" => truncate(sh, args),
        "chmod" => chmod(sh, args),
        "touch" => touch(sh, args),
        "tree" => tree(sh, args),
        "du" => du(sh, args),
        "df" => df(sh, args),
        "find" => find(sh, args),
        "import" => import(sh, args),
        "export" => export(sh, args),
        "xattr" => xattr(sh, args),
        "log" => log(sh, args),
        "snapshot" => snapshot(sh, args),
        "rollback" => rollback(sh, args),
        "diff" => diff(sh, args),
        "help" => help(sh, args),
        "clear" => clear(sh, args),
        "exit" => exit(sh, args),
        _ => unreachable!("every spec has a handler"),
    }
}

// ---- shared helpers --------------------------------------------------------------

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn basename(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

/// The `-n N` check: N must equal the number of items, and be positive.
fn parallel_count(opts: &Opts, items: usize) -> Result<Option<usize>, super::CmdError> {
    let Some(v) = opts.value("-n") else {
        return Ok(None);
    };
    let n: usize = v
        .parse()
        .map_err(|_| super::CmdError(format!("-n needs a positive number, not {v:?}")))?;
    if n == 0 {
        return err("-n needs a positive number, not 0");
    }
    if n != items {
        return err(format!(
            "-n {n} does not match the {items} name{} given",
            if items == 1 { "" } else { "s" }
        ));
    }
    Ok(Some(n))
}

/// Runs `op` on every item, on up to `parallel` worker threads when given
/// (`-n N`), and reports every failure in item order, so that both forms
/// print the same thing.
fn for_each<T: Sync>(
    items: &[T],
    parallel: Option<usize>,
    op: impl Fn(&T) -> CmdResult + Sync + Send,
) -> CmdResult {
    let results: Vec<CmdResult> = match parallel {
        Some(n) => in_parallel(items, n, &op),
        None => items.iter().map(&op).collect(),
    };
    report_all(results)
}

/// `op` on every item on `n` workers, the results in item order. One worker
/// per core at most (`-n` can name thousands of files), each on a contiguous
/// run of the items, so that joining the workers in turn keeps the order.
fn in_parallel<T: Sync>(
    items: &[T],
    n: usize,
    op: &(impl Fn(&T) -> CmdResult + Sync),
) -> Vec<CmdResult> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let workers = n.min(cores).max(1);
    let run = items.len().div_ceil(workers).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(run)
            .map(|chunk| s.spawn(move || chunk.iter().map(op).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Prints all but the last failure, and returns the last one: a command that
/// fails on several names says so for each, one line per name.
fn report_all(results: Vec<CmdResult>) -> CmdResult {
    let mut failures: Vec<super::CmdError> = results.into_iter().filter_map(|r| r.err()).collect();
    let last = failures.pop();
    for f in failures {
        return_err_line(&f);
    }
    match last {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

thread_local! {
    static CURRENT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

fn return_err_line(e: &super::CmdError) {
    CURRENT.with(|c| eprintln!("{}: {}", c.borrow(), e));
}

/// The absolute path of directory `ino`, found by walking `..` up to the root.
pub fn dir_path(fs: &Fs, ino: u64) -> Result<String, Errno> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut cur = ino;
    while cur != ROOT_INO {
        let parent = fs.lookup_noref(cur, b"..")?.ino;
        let mut found = None;
        fs.readdir(parent, 2, |e| {
            if e.ino == cur {
                found = Some(e.name.to_vec());
                false
            } else {
                true
            }
        })?;
        parts.push(found.ok_or(Errno::ENOENT)?);
        cur = parent;
    }
    if parts.is_empty() {
        return Ok("/".into());
    }
    let mut s = String::new();
    for p in parts.iter().rev() {
        s.push('/');
        s.push_str(&String::from_utf8_lossy(p));
    }
    Ok(s)
}

fn is_dir(fs: &Fs, cwd: u64, path: &str) -> bool {
    fs.stat_path(cwd, path)
        .is_ok_and(|a| a.kind == FileType::Directory)
}

// ---- the classic set ------------------------------------------------------------

fn create(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[("-n", true)])?;
    if o.operands.is_empty() {
        return usage("create");
    }
    let parallel = parallel_count(&o, o.operands.len())?;
    let (fs, ctx, cwd) = (&sh.fs, sh.ctx, sh.cwd());
    for_each(&o.operands, parallel, |name| {
        fs.create_path(ctx, cwd, name, 0o644, true)
            .map(|_| ())
            .map_err(|e| fs_err(e, name))
    })
}

fn set_current(cmd: &str) {
    CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        c.clear();
        c.push_str(cmd);
    });
}

/// Writes `data` to `path` (created if missing): appended, or at `at`.
fn write_one(fs: &Fs, ctx: Ctx, cwd: u64, path: &str, data: &[u8], at: Option<u64>) -> CmdResult {
    let ino = match fs.resolve(cwd, path, true) {
        Ok(ino) => ino,
        Err(Errno::ENOENT) => {
            fs.create_path(ctx, cwd, path, 0o644, false)
                .map_err(|e| fs_err(e, path))?
                .ino
        }
        Err(e) => return Err(fs_err(e, path)),
    };
    match fs.getattr(ino).map_err(|e| fs_err(e, path))?.kind {
        FileType::RegularFile => {}
        FileType::Directory => return Err(fs_err(Errno::EISDIR, path)),
        _ => return err(format!("not a regular file: {path}")),
    }
    fs.write(ctx, ino, at.unwrap_or(0), data, at.is_none())
        .map(|_| ())
        .map_err(|e| fs_err(e, path))
}

fn write(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[("-n", true), ("--at", true)])?;
    if o.operands.is_empty() || o.operands.len() % 2 != 0 {
        return usage("write");
    }
    let at = match o.value("--at") {
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| super::CmdError(format!("invalid offset: {v}")))?,
        ),
        None => None,
    };
    let pairs: Vec<(&String, &String)> = o.operands.chunks(2).map(|c| (&c[0], &c[1])).collect();
    let parallel = parallel_count(&o, pairs.len())?;
    let (fs, ctx, cwd) = (&sh.fs, sh.ctx, sh.cwd());
    for_each(&pairs, parallel, |(path, text)| {
        write_one(fs, ctx, cwd, path, text.as_bytes(), at)
    })
}

fn read(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    if o.operands.is_empty() {
        return usage("read");
    }
    let mut results = Vec::new();
    for path in &o.operands {
        let found = match super::snap::split(sh.cwd(), path) {
            Some(comps) => super::snap::read(&sh.fs, path, &comps),
            None => sh.fs.read_file(sh.cwd(), path).map_err(|e| match e {
                Errno::EINVAL => super::CmdError(format!("not a regular file: {path}")),
                e => fs_err(e, path),
            }),
        };
        let r = match found {
            Ok(data) => {
                sh.out.write_all(&data)?;
                if !data.is_empty() && !data.ends_with(b"\n") {
                    sh.out.write_all(b"\n")?;
                }
                Ok(())
            }
            Err(e) => Err(e),
        };
        results.push(r);
    }
    sh.out.flush()?;
    report_all(results)
}

fn delete(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[("-n", true)])?;
    if o.operands.is_empty() {
        return usage("delete");
    }
    let parallel = parallel_count(&o, o.operands.len())?;
    let (fs, cwd) = (&sh.fs, sh.cwd());
    for_each(&o.operands, parallel, |name| {
        match fs.unlink_path(cwd, name) {
            Ok(()) => Ok(()),
            Err(Errno::EISDIR) => err(format!("is a directory (use rmdir): {name}")),
            Err(e) => Err(fs_err(e, name)),
        }
    })
}

fn ls_line(fs: &Fs, name: &[u8], a: &Attr, long: bool) -> String {
    ls_line_with(name, a, long, |ino| fs.readlink(ino).ok())
}

fn ls(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(
        args,
        &[("-l", false), ("-a", false), ("-la", false), ("-al", false)],
    )?;
    let long = o.has("-l") || o.has("-la") || o.has("-al");
    let all = o.has("-a") || o.has("-la") || o.has("-al");
    let paths = if o.operands.is_empty() {
        vec![".".to_string()]
    } else {
        o.operands.clone()
    };
    let cwd = sh.cwd();
    let mut results = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        if let Some(comps) = super::snap::split(cwd, path) {
            if paths.len() > 1 {
                if i > 0 {
                    writeln!(sh.out)?;
                }
                writeln!(sh.out, "{path}:")?;
            }
            results.push(super::snap::ls(sh, path, &comps, long, all));
            continue;
        }
        let attr = match sh.fs.stat_path(cwd, path) {
            Ok(a) => a,
            Err(e) => {
                results.push(Err(fs_err(e, path)));
                continue;
            }
        };
        if attr.kind != FileType::Directory {
            let a = sh.fs.lstat_path(cwd, path).unwrap_or(attr);
            let line = ls_line(&sh.fs, path.as_bytes(), &a, long);
            writeln!(sh.out, "{line}")?;
            continue;
        }
        if paths.len() > 1 {
            if i > 0 {
                writeln!(sh.out)?;
            }
            writeln!(sh.out, "{path}:")?;
        }
        let mut entries: Vec<(Vec<u8>, u64)> = Vec::new();
        let r = sh.fs.readdir(attr.ino, if all { 0 } else { 2 }, |e| {
            entries.push((e.name.to_vec(), e.ino));
            true
        });
        if let Err(e) = r {
            results.push(Err(fs_err(e, path)));
            continue;
        }
        entries.sort();
        for (name, ino) in entries {
            // An entry removed concurrently (by a parallel command) is skipped.
            let Ok(a) = sh.fs.getattr(ino) else { continue };
            let line = ls_line(&sh.fs, &name, &a, long);
            writeln!(sh.out, "{line}")?;
        }
        results.push(Ok(()));
    }
    report_all(results)
}

// ---- the everyday set ---------------------------------------------------------------

fn mkdir(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[("-p", false)])?;
    if o.operands.is_empty() {
        return usage("mkdir");
    }
    let (fs, ctx, cwd) = (&sh.fs, sh.ctx, sh.cwd());
    let parents = o.has("-p");
    for_each(&o.operands, None, |p| {
        let r = if parents {
            fs.mkdir_all(ctx, cwd, p, 0o755).map(|_| ())
        } else {
            fs.mkdir_path(ctx, cwd, p, 0o755).map(|_| ())
        };
        r.map_err(|e| fs_err(e, p))
    })
}

fn rmdir(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    if o.operands.is_empty() {
        return usage("rmdir");
    }
    let (fs, cwd) = (&sh.fs, sh.cwd());
    for_each(&o.operands, None, |p| {
        fs.rmdir_path(cwd, p).map_err(|e| fs_err(e, p))
    })
}

fn cd(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    if o.operands.len() > 1 {
        return usage("cd");
    }
    let path = o.operands.first().map_or("/", |s| s.as_str());
    let ino = sh
        .fs
        .resolve(sh.cwd(), path, true)
        .map_err(|e| fs_err(e, path))?;
    let attr = sh.fs.getattr(ino).map_err(|e| fs_err(e, path))?;
    if attr.kind != FileType::Directory {
        return Err(fs_err(Errno::ENOTDIR, path));
    }
    // Hold a reference on the new directory so that it stays valid (empty and
    // unlinked) even if it is removed while we are in it, as on Linux.
    sh.fs.lookup(ino, b".").map_err(|e| fs_err(e, path))?;
    let old = sh.cwd.swap(ino, Ordering::AcqRel);
    sh.fs.forget(old, 1);
    Ok(())
}

fn pwd(sh: &mut Shell, args: &[String]) -> CmdResult {
    if !args.is_empty() {
        return usage("pwd");
    }
    match sh.cwd_path() {
        Ok(p) => {
            writeln!(sh.out, "{p}")?;
            Ok(())
        }
        Err(_) => err("the current directory was removed (cd / to leave it)"),
    }
}

/// Where `src` goes for `mv`/`cp`/`ln` to `dest`: into it when it is a directory.
fn target_path(fs: &Fs, cwd: u64, src: &str, dest: &str, into: bool) -> String {
    if into || is_dir(fs, cwd, dest) {
        join(dest, basename(src))
    } else {
        dest.to_string()
    }
}

fn mv(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    if o.operands.len() < 2 {
        return usage("mv");
    }
    let (srcs, dest) = o.operands.split_at(o.operands.len() - 1);
    let dest = &dest[0];
    let cwd = sh.cwd();
    if srcs.len() > 1 && !is_dir(&sh.fs, cwd, dest) {
        return Err(fs_err(Errno::ENOTDIR, dest));
    }
    let fs = &sh.fs;
    for_each(srcs, None, |src| {
        fs.lstat_path(cwd, src).map_err(|e| fs_err(e, src))?;
        let to = target_path(fs, cwd, src, dest, false);
        match fs.rename_path(cwd, src, &to, RenameFlags::default()) {
            Ok(()) => Ok(()),
            Err(Errno::EINVAL) => err(format!("cannot move a directory into itself: {src}")),
            Err(e) => Err(fs_err(e, &to)),
        }
    })
}

const CHUNK: usize = 1 << 20;

/// What a copy needs besides the node: the engine, the caller and `-r`.
struct Copier<'a> {
    fs: &'a Fs,
    ctx: Ctx,
    recursive: bool,
}

/// Copies the node `src` to a new entry `name` in directory `dir`.
fn copy_node(
    cp: &Copier<'_>,
    src: &Attr,
    src_path: &str,
    dir: u64,
    name: &[u8],
    shown: &str,
) -> CmdResult {
    let (fs, ctx) = (cp.fs, cp.ctx);
    match src.kind {
        FileType::RegularFile => copy_file(cp, src, src_path, dir, name, shown),
        FileType::Symlink => {
            let target = fs.readlink(src.ino).map_err(|e| fs_err(e, src_path))?;
            let a = fs
                .symlink(ctx, dir, name, &target)
                .map_err(|e| fs_err(e, shown))?;
            fs.forget(a.ino, 1);
            Ok(())
        }
        FileType::Directory => {
            if !cp.recursive {
                return err(format!("is a directory (use cp -r): {src_path}"));
            }
            copy_dir(cp, src, src_path, dir, name, shown)
        }
        _ => {
            let a = fs
                .mknod(ctx, dir, name, src.mode(), src.rdev)
                .map_err(|e| fs_err(e, shown))?;
            fs.forget(a.ino, 1);
            Ok(())
        }
    }
}

fn copy_file(
    cp: &Copier<'_>,
    src: &Attr,
    src_path: &str,
    dir: u64,
    name: &[u8],
    shown: &str,
) -> CmdResult {
    let (fs, ctx) = (cp.fs, cp.ctx);
    let (dst, _) = fs
        .create(ctx, dir, name, src.perm as u32, false)
        .map_err(|e| fs_err(e, shown))?;
    let r = (|| -> CmdResult {
        if dst.ino == src.ino {
            return err(format!("{src_path} and {shown} are the same file"));
        }
        let trunc = SetAttr {
            size: Some(0),
            mode: Some(src.perm as u32),
            ..Default::default()
        };
        fs.setattr(ctx, dst.ino, &trunc)
            .map_err(|e| fs_err(e, shown))?;
        let mut off = 0;
        while off < src.size {
            let n = fs
                .copy_file_range(ctx, src.ino, off, dst.ino, off, src.size - off)
                .map_err(|e| fs_err(e, shown))?;
            if n == 0 {
                break;
            }
            off += n;
        }
        copy_xattrs(fs, src.ino, dst.ino, shown)
    })();
    fs.release(dst.ino);
    fs.forget(dst.ino, 1);
    r
}

fn copy_dir(
    cp: &Copier<'_>,
    src: &Attr,
    src_path: &str,
    dir: u64,
    name: &[u8],
    shown: &str,
) -> CmdResult {
    let fs = cp.fs;
    let d = dir_to_fill(fs, cp.ctx, dir, name, src.perm as u32, shown)?;
    // Copying a directory into itself would never end.
    let mut up = d.ino;
    while up != ROOT_INO {
        if up == src.ino {
            return err(format!("cannot copy a directory into itself: {src_path}"));
        }
        up = fs
            .lookup_noref(up, b"..")
            .map_err(|e| fs_err(e, shown))?
            .ino;
    }
    copy_xattrs(fs, src.ino, d.ino, shown)?;
    let mut children: Vec<(Vec<u8>, u64)> = Vec::new();
    fs.readdir(src.ino, 2, |e| {
        children.push((e.name.to_vec(), e.ino));
        true
    })
    .map_err(|e| fs_err(e, src_path))?;
    for (cname, cino) in children {
        let Ok(ca) = fs.getattr(cino) else { continue };
        let cn = name_str(&cname);
        copy_node(
            cp,
            &ca,
            &join(src_path, &cn),
            d.ino,
            &cname,
            &join(shown, &cn),
        )?;
    }
    Ok(())
}

/// The directory `name` in `dir` that a copy or an import fills: the one
/// there, or a new one.
fn dir_to_fill(
    fs: &Fs,
    ctx: Ctx,
    dir: u64,
    name: &[u8],
    perm: u32,
    shown: &str,
) -> Result<Attr, super::CmdError> {
    match fs.lookup_noref(dir, name) {
        Ok(a) if a.kind == FileType::Directory => Ok(a),
        Ok(_) => Err(fs_err(Errno::ENOTDIR, shown)),
        Err(Errno::ENOENT) => {
            let a = fs
                .mkdir(ctx, dir, name, perm)
                .map_err(|e| fs_err(e, shown))?;
            fs.forget(a.ino, 1);
            Ok(a)
        }
        Err(e) => Err(fs_err(e, shown)),
    }
}

fn copy_xattrs(fs: &Fs, from: u64, to: u64, shown: &str) -> CmdResult {
    let list = fs.listxattr(from).map_err(|e| fs_err(e, shown))?;
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if let Ok(v) = fs.getxattr(from, name) {
            fs.setxattr(to, name, &v, XattrMode::Any)
                .map_err(|e| fs_err(e, shown))?;
        }
    }
    Ok(())
}

fn cp(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[("-r", false), ("-R", false)])?;
    if o.operands.len() < 2 {
        return usage("cp");
    }
    let recursive = o.has("-r") || o.has("-R");
    let (srcs, dest) = o.operands.split_at(o.operands.len() - 1);
    let dest = &dest[0];
    let (fs, ctx, cwd) = (&sh.fs, sh.ctx, sh.cwd());
    if srcs.len() > 1 && !is_dir(fs, cwd, dest) {
        return Err(fs_err(Errno::ENOTDIR, dest));
    }
    for_each(srcs, None, |src| {
        let a = fs.stat_path(cwd, src).map_err(|e| fs_err(e, src))?;
        let to = target_path(fs, cwd, src, dest, false);
        let (dir, name) = fs.resolve_parent(cwd, &to).map_err(|e| fs_err(e, &to))?;
        let copier = Copier { fs, ctx, recursive };
        copy_node(&copier, &a, src, dir, &name, &to)
    })
}

fn ln(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[("-s", false)])?;
    if o.operands.len() != 2 {
        return usage("ln");
    }
    let (target, link) = (&o.operands[0], &o.operands[1]);
    let cwd = sh.cwd();
    let to = target_path(&sh.fs, cwd, target, link, false);
    if o.has("-s") {
        sh.fs
            .symlink_path(sh.ctx, cwd, target, &to)
            .map_err(|e| fs_err(e, &to))?;
    } else {
        sh.fs
            .lstat_path(cwd, target)
            .map_err(|e| fs_err(e, target))?;
        match sh.fs.link_path(cwd, target, &to) {
            Ok(_) => {}
            Err(Errno::EPERM) => return err(format!("cannot hard-link a directory: {target}")),
            Err(e) => return Err(fs_err(e, &to)),
        }
    }
    Ok(())
}

fn kind_name(k: FileType) -> &'static str {
    match k {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::NamedPipe => "fifo",
        FileType::Socket => "socket",
        FileType::CharDevice => "character special file",
        FileType::BlockDevice => "block special file",
    }
}

fn stat(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    if o.operands.is_empty() {
        return usage("stat");
    }
    let mut results = Vec::new();
    for path in &o.operands {
        let a = match sh.fs.lstat_path(sh.cwd(), path) {
            Ok(a) => a,
            Err(e) => {
                results.push(Err(fs_err(e, path)));
                continue;
            }
        };
        let mut shown = path.clone();
        if a.kind == FileType::Symlink
            && let Ok(t) = sh.fs.readlink(a.ino)
        {
            shown = format!("{path} -> {}", name_str(&t));
        }
        writeln!(sh.out, "  File: {shown}")?;
        writeln!(
            sh.out,
            "  Size: {:<12} Blocks: {:<10} IO Block: {:<6} {}",
            a.size,
            a.blocks,
            a.blksize,
            kind_name(a.kind)
        )?;
        writeln!(sh.out, " Inode: {:<12} Links: {}", a.ino, a.nlink)?;
        writeln!(
            sh.out,
            "Access: ({:04o}/{})  Uid: {}  Gid: {}",
            a.perm,
            mode_string(&a),
            a.uid,
            a.gid
        )?;
        writeln!(sh.out, "Access: {}", format_time(a.atime, true))?;
        writeln!(sh.out, "Modify: {}", format_time(a.mtime, true))?;
        writeln!(sh.out, "Change: {}", format_time(a.ctime, true))?;
        results.push(Ok(()));
    }
    report_all(results)
}

fn truncate(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[("-s", true)])?;
    let Some(size) = o.value("-s") else {
        return usage("truncate");
    };
    if o.operands.is_empty() {
        return usage("truncate");
    }
    // K, M, G are powers of 1024 here, as in coreutils.
    let size = memfs_durable::parse_bytes(size)
        .map_err(|_| super::CmdError(format!("invalid size: {size}")))?;
    let (fs, ctx, cwd) = (&sh.fs, sh.ctx, sh.cwd());
    for_each(&o.operands, None, |p| {
        let ino = match fs.resolve(cwd, p, true) {
            Ok(i) => i,
            Err(Errno::ENOENT) => {
                fs.create_path(ctx, cwd, p, 0o644, false)
                    .map_err(|e| fs_err(e, p))?
                    .ino
            }
            Err(e) => return Err(fs_err(e, p)),
        };
        let set = SetAttr {
            size: Some(size),
            ..Default::default()
        };
        fs.setattr(ctx, ino, &set)
            .map(|_| ())
            .map_err(|e| fs_err(e, p))
    })
}

fn chmod(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    if o.operands.len() < 2 {
        return usage("chmod");
    }
    let m = &o.operands[0];
    let mode = match u32::from_str_radix(m, 8) {
        Ok(v) if v <= 0o7777 => v,
        _ => return err(format!("invalid mode (use octal, e.g. 644): {m}")),
    };
    let (fs, ctx, cwd) = (&sh.fs, sh.ctx, sh.cwd());
    for_each(&o.operands[1..], None, |p| {
        let ino = fs.resolve(cwd, p, true).map_err(|e| fs_err(e, p))?;
        let set = SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        fs.setattr(ctx, ino, &set)
            .map(|_| ())
            .map_err(|e| fs_err(e, p))
    })
}

fn touch(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    if o.operands.is_empty() {
        return usage("touch");
    }
    let (fs, ctx, cwd) = (&sh.fs, sh.ctx, sh.cwd());
    for_each(&o.operands, None, |p| match fs.resolve(cwd, p, true) {
        Ok(ino) => {
            let set = SetAttr {
                atime: Some(SetTime::Now),
                mtime: Some(SetTime::Now),
                ..Default::default()
            };
            fs.setattr(ctx, ino, &set)
                .map(|_| ())
                .map_err(|e| fs_err(e, p))
        }
        Err(Errno::ENOENT) => fs
            .create_path(ctx, cwd, p, 0o644, false)
            .map(|_| ())
            .map_err(|e| fs_err(e, p)),
        Err(e) => Err(fs_err(e, p)),
    })
}

/// Sorted entries of a directory, without `.` and `..`.
fn children(fs: &Fs, dir: u64) -> Result<Vec<(Vec<u8>, Attr)>, Errno> {
    let mut names: Vec<(Vec<u8>, u64)> = Vec::new();
    fs.readdir(dir, 2, |e| {
        names.push((e.name.to_vec(), e.ino));
        true
    })?;
    names.sort();
    Ok(names
        .into_iter()
        .filter_map(|(n, ino)| fs.getattr(ino).ok().map(|a| (n, a)))
        .collect())
}

fn tree(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    if o.operands.len() > 1 {
        return usage("tree");
    }
    let path = o.operands.first().map_or(".", |s| s.as_str());
    let root = sh
        .fs
        .stat_path(sh.cwd(), path)
        .map_err(|e| fs_err(e, path))?;
    writeln!(sh.out, "{path}")?;
    if root.kind != FileType::Directory {
        return Ok(());
    }
    let (mut dirs, mut files) = (0u64, 0u64);
    fn walk(
        fs: &Fs,
        out: &mut dyn Write,
        dir: u64,
        prefix: &str,
        dirs: &mut u64,
        files: &mut u64,
    ) -> std::io::Result<()> {
        let Ok(entries) = children(fs, dir) else {
            return Ok(());
        };
        let n = entries.len();
        for (i, (name, a)) in entries.into_iter().enumerate() {
            let last = i + 1 == n;
            let mut line = format!(
                "{prefix}{}{}",
                if last { "└── " } else { "├── " },
                name_str(&name)
            );
            if a.kind == FileType::Symlink
                && let Ok(t) = fs.readlink(a.ino)
            {
                line.push_str(&format!(" -> {}", name_str(&t)));
            }
            writeln!(out, "{line}")?;
            if a.kind == FileType::Directory {
                *dirs += 1;
                let p = format!("{prefix}{}", if last { "    " } else { "│   " });
                walk(fs, out, a.ino, &p, dirs, files)?;
            } else {
                *files += 1;
            }
        }
        Ok(())
    }
    walk(&sh.fs, &mut *sh.out, root.ino, "", &mut dirs, &mut files)?;
    writeln!(
        sh.out,
        "\n{dirs} director{}, {files} file{}",
        if dirs == 1 { "y" } else { "ies" },
        if files == 1 { "" } else { "s" }
    )?;
    Ok(())
}

fn du(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    let paths = if o.operands.is_empty() {
        vec![".".to_string()]
    } else {
        o.operands.clone()
    };
    let mut results = Vec::new();
    for path in &paths {
        let a = match sh.fs.lstat_path(sh.cwd(), path) {
            Ok(a) => a,
            Err(e) => {
                results.push(Err(fs_err(e, path)));
                continue;
            }
        };
        let mut seen = HashSet::new();
        let (mut alloc, mut apparent) = (0u64, 0u64);
        let mut stack = vec![a];
        while let Some(a) = stack.pop() {
            if a.nlink > 1 && a.kind != FileType::Directory && !seen.insert(a.ino) {
                continue;
            }
            alloc += a.blocks * 512;
            apparent += a.size;
            if a.kind == FileType::Directory
                && let Ok(c) = children(&sh.fs, a.ino)
            {
                stack.extend(c.into_iter().map(|(_, a)| a));
            }
        }
        writeln!(
            sh.out,
            "{}\t{}\t{}",
            human::bytes(alloc),
            human::bytes(apparent),
            path
        )?;
        results.push(Ok(()));
    }
    report_all(results)
}

fn df(sh: &mut Shell, args: &[String]) -> CmdResult {
    if !args.is_empty() {
        return usage("df");
    }
    let s = sh.fs.statfs();
    let bs = s.frsize as u64;
    let (size, free) = (s.blocks * bs, s.bfree * bs);
    let used = size - free;
    let pct = |used: u64, total: u64| {
        if total == 0 {
            0
        } else {
            (used * 100).div_ceil(total)
        }
    };
    writeln!(
        sh.out,
        "{:>8} {:>8} {:>8} {:>5} {:>10} {:>10} {:>10} {:>5}",
        "Size", "Used", "Avail", "Use%", "Inodes", "IUsed", "IFree", "IUse%"
    )?;
    let iused = s.files - s.ffree;
    writeln!(
        sh.out,
        "{:>8} {:>8} {:>8} {:>4}% {:>10} {:>10} {:>10} {:>4}%",
        human::bytes(size),
        human::bytes(used),
        human::bytes(free),
        pct(used, size),
        s.files,
        iused,
        s.ffree,
        pct(iused, s.files)
    )?;
    Ok(())
}

/// Shell-style glob match of `name` against `pat` (`*`, `?`, `[...]`).
pub fn glob_match(pat: &[u8], name: &[u8]) -> bool {
    // Iterative matcher with backtracking to the last `*`: O(len(pat) * len(name)).
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pat.len() {
            match pat[p] {
                b'*' => {
                    star = Some((p, n));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    n += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class_match(&pat[p..], name[n]) {
                        if matched {
                            p += next;
                            n += 1;
                            continue;
                        }
                    } else if name[n] == b'[' {
                        p += 1;
                        n += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pat.len() && pat[p + 1] == name[n] => {
                    p += 2;
                    n += 1;
                    continue;
                }
                c if c == name[n] => {
                    p += 1;
                    n += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, sn)) => {
                p = sp + 1;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class at the start of `pat`; returns whether it
/// matched and the class's length, or None if the class is not closed.
fn class_match(pat: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(pat.get(i), Some(b'!') | Some(b'^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while i < pat.len() {
        if pat[i] == b']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if i + 2 < pat.len() && pat[i + 1] == b'-' && pat[i + 2] != b']' {
            if pat[i] <= c && c <= pat[i + 2] {
                matched = true;
            }
            i += 3;
        } else {
            if pat[i] == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
}

fn find(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    let (dir, pat) = match o.operands.as_slice() {
        [pat] => (".", pat.as_str()),
        [dir, pat] => (dir.as_str(), pat.as_str()),
        _ => return usage("find"),
    };
    let root = sh.fs.stat_path(sh.cwd(), dir).map_err(|e| fs_err(e, dir))?;
    if root.kind != FileType::Directory {
        return Err(fs_err(Errno::ENOTDIR, dir));
    }
    // Depth-first, pre-order, in name order, so that the output is stable.
    fn walk(fs: &Fs, out: &mut dyn Write, dir: u64, path: &str, pat: &[u8]) -> std::io::Result<()> {
        let Ok(entries) = children(fs, dir) else {
            return Ok(());
        };
        for (name, a) in entries {
            let p = join(path, &name_str(&name));
            if glob_match(pat, &name) {
                writeln!(out, "{p}")?;
            }
            if a.kind == FileType::Directory {
                walk(fs, out, a.ino, &p, pat)?;
            }
        }
        Ok(())
    }
    let base = dir.trim_end_matches('/');
    let base = if base.is_empty() { "/" } else { base };
    walk(&sh.fs, &mut *sh.out, root.ino, base, pat.as_bytes())?;
    Ok(())
}

// ---- moving data in and out ---------------------------------------------------------

fn host_err(e: std::io::Error, path: &Path) -> super::CmdError {
    let msg = match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        std::io::ErrorKind::AlreadyExists => "already exists".to_string(),
        _ => e.to_string().to_lowercase(),
    };
    super::CmdError(format!("{msg}: {} (host)", path.display()))
}

fn import_node(
    fs: &Fs,
    ctx: Ctx,
    host: &Path,
    dir: u64,
    name: &[u8],
    shown: &str,
    count: &mut u64,
) -> CmdResult {
    let meta = std::fs::symlink_metadata(host).map_err(|e| host_err(e, host))?;
    let perm = meta.permissions().mode() & 0o7777;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = std::fs::read_link(host).map_err(|e| host_err(e, host))?;
        let a = fs
            .symlink(ctx, dir, name, target.as_os_str().as_encoded_bytes())
            .map_err(|e| fs_err(e, shown))?;
        fs.forget(a.ino, 1);
    } else if ft.is_dir() {
        let d = dir_to_fill(fs, ctx, dir, name, perm, shown)?;
        let mut entries: Vec<_> = std::fs::read_dir(host)
            .map_err(|e| host_err(e, host))?
            .collect::<Result<_, _>>()
            .map_err(|e| host_err(e, host))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let n = e.file_name();
            let ns = n.to_string_lossy().into_owned();
            import_node(
                fs,
                ctx,
                &e.path(),
                d.ino,
                n.as_encoded_bytes(),
                &join(shown, &ns),
                count,
            )?;
        }
    } else if ft.is_file() {
        import_file(fs, ctx, host, dir, name, perm, shown)?;
    } else {
        return err(format!("unsupported file type: {} (host)", host.display()));
    }
    *count += 1;
    Ok(())
}

fn import_file(
    fs: &Fs,
    ctx: Ctx,
    host: &Path,
    dir: u64,
    name: &[u8],
    perm: u32,
    shown: &str,
) -> CmdResult {
    let mut f = std::fs::File::open(host).map_err(|e| host_err(e, host))?;
    let (a, _) = fs
        .create(ctx, dir, name, perm, false)
        .map_err(|e| fs_err(e, shown))?;
    let r = (|| -> CmdResult {
        let set = SetAttr {
            size: Some(0),
            mode: Some(perm),
            ..Default::default()
        };
        fs.setattr(ctx, a.ino, &set).map_err(|e| fs_err(e, shown))?;
        let mut buf = vec![0u8; CHUNK];
        let mut off = 0u64;
        loop {
            let n = f.read(&mut buf).map_err(|e| host_err(e, host))?;
            if n == 0 {
                break;
            }
            fs.write(ctx, a.ino, off, &buf[..n], false)
                .map_err(|e| fs_err(e, shown))?;
            off += n as u64;
        }
        Ok(())
    })();
    fs.release(a.ino);
    fs.forget(a.ino, 1);
    r
}

fn import(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    let (host, dest) = match o.operands.as_slice() {
        [h] => (h, ".".to_string()),
        [h, d] => (h, d.clone()),
        _ => return usage("import"),
    };
    let hp = PathBuf::from(host);
    let base = hp
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "import".into());
    let cwd = sh.cwd();
    let to = if is_dir(&sh.fs, cwd, &dest) {
        join(&dest, &base)
    } else {
        dest
    };
    let (dir, name) = sh.fs.resolve_parent(cwd, &to).map_err(|e| fs_err(e, &to))?;
    let mut count = 0;
    import_node(&sh.fs, sh.ctx, &hp, dir, &name, &to, &mut count)?;
    if sh.interactive {
        writeln!(
            sh.out,
            "imported {count} node{} into {to}",
            if count == 1 { "" } else { "s" }
        )?;
    }
    Ok(())
}

fn export_node(fs: &Fs, a: &Attr, shown: &str, host: &Path, count: &mut u64) -> CmdResult {
    match a.kind {
        FileType::RegularFile => {
            let mut f = std::fs::File::create(host).map_err(|e| host_err(e, host))?;
            let mut buf = vec![0u8; CHUNK];
            let mut off = 0u64;
            while off < a.size {
                let n = fs
                    .read(a.ino, off, &mut buf)
                    .map_err(|e| fs_err(e, shown))?;
                if n == 0 {
                    break;
                }
                f.write_all(&buf[..n]).map_err(|e| host_err(e, host))?;
                off += n as u64;
            }
            f.set_permissions(std::fs::Permissions::from_mode(a.perm as u32))
                .map_err(|e| host_err(e, host))?;
        }
        FileType::Directory => {
            match std::fs::create_dir(host) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && host.is_dir() => {}
                Err(e) => return Err(host_err(e, host)),
            }
            for (name, ca) in children(fs, a.ino).map_err(|e| fs_err(e, shown))? {
                let n = OsStr::from_bytes(&name);
                export_node(
                    fs,
                    &ca,
                    &join(shown, &name_str(&name)),
                    &host.join(n),
                    count,
                )?;
            }
            std::fs::set_permissions(host, std::fs::Permissions::from_mode(a.perm as u32))
                .map_err(|e| host_err(e, host))?;
        }
        FileType::Symlink => {
            let t = fs.readlink(a.ino).map_err(|e| fs_err(e, shown))?;
            std::os::unix::fs::symlink(OsStr::from_bytes(&t), host)
                .map_err(|e| host_err(e, host))?;
        }
        _ => return err(format!("cannot export a special file: {shown}")),
    }
    *count += 1;
    Ok(())
}

fn export(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    let [src, host] = o.operands.as_slice() else {
        return usage("export");
    };
    let a = sh
        .fs
        .lstat_path(sh.cwd(), src)
        .map_err(|e| fs_err(e, src))?;
    let mut hp = PathBuf::from(host);
    if hp.is_dir() {
        let base = basename(src);
        hp = hp.join(if base.is_empty() { "export" } else { base });
    }
    if a.kind != FileType::Directory && hp.symlink_metadata().is_ok_and(|m| m.is_dir()) {
        return Err(host_err(
            std::io::Error::from_raw_os_error(libc::EISDIR),
            &hp,
        ));
    }
    let mut count = 0;
    export_node(&sh.fs, &a, src, &hp, &mut count)?;
    if sh.interactive {
        writeln!(
            sh.out,
            "exported {count} node{} to {}",
            if count == 1 { "" } else { "s" },
            hp.display()
        )?;
    }
    Ok(())
}

fn xattr(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    let ops = o.operands.iter().map(|s| s.as_str()).collect::<Vec<_>>();
    let cwd = sh.cwd();
    let ino = |p: &str| sh.fs.resolve(cwd, p, true).map_err(|e| fs_err(e, p));
    let name_err = |e: Errno, path: &str, name: &str| match e {
        Errno::ENODATA => super::CmdError(format!("no such attribute: {name} on {path}")),
        Errno::EEXIST => super::CmdError(format!("attribute exists: {name} on {path}")),
        Errno::EOPNOTSUPP | Errno::EINVAL => super::CmdError(format!(
            "unsupported attribute name (use a namespace such as user.): {name}"
        )),
        e => fs_err(e, path),
    };
    match ops.as_slice() {
        ["get", path, name] => {
            let v = sh
                .fs
                .getxattr(ino(path)?, name.as_bytes())
                .map_err(|e| name_err(e, path, name))?;
            sh.out.write_all(&v)?;
            writeln!(sh.out)?;
        }
        ["set", path, name, value] => {
            sh.fs
                .setxattr(
                    ino(path)?,
                    name.as_bytes(),
                    value.as_bytes(),
                    XattrMode::Any,
                )
                .map_err(|e| name_err(e, path, name))?;
        }
        ["list", path] => {
            let list = sh.fs.listxattr(ino(path)?).map_err(|e| fs_err(e, path))?;
            let mut names: Vec<&[u8]> = list.split(|&b| b == 0).filter(|n| !n.is_empty()).collect();
            names.sort();
            for n in names {
                writeln!(sh.out, "{}", name_str(n))?;
            }
        }
        ["rm", path, name] => {
            sh.fs
                .removexattr(ino(path)?, name.as_bytes())
                .map_err(|e| name_err(e, path, name))?;
        }
        _ => return usage("xattr"),
    }
    Ok(())
}

// ---- durable file systems -------------------------------------------------------------

fn needs_durable(sh: &Shell) -> Result<&dyn super::Durable, super::CmdError> {
    match &sh.durable {
        Some(d) => Ok(d.as_ref()),
        None => err(
            "this session is in memory only: start the shell with --data-dir PATH for a durable memfs",
        ),
    }
}

fn log(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[("-n", true)])?;
    let limit = match o.value("-n") {
        Some(v) => Some(
            v.parse::<usize>()
                .map_err(|_| super::CmdError(format!("invalid count: {v}")))?,
        ),
        None => None,
    };
    if !o.operands.is_empty() {
        return usage("log");
    }
    let d = needs_durable(sh)?;
    let mut buf = Vec::new();
    d.log(&mut buf, limit)
        .map_err(|e| super::CmdError(format!("{e:#}")))?;
    sh.out.write_all(&buf)?;
    Ok(())
}

fn snapshot(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    let ops: Vec<&str> = o.operands.iter().map(|s| s.as_str()).collect();
    if !matches!(ops.as_slice(), ["create", _] | ["list"] | ["delete", _]) {
        return usage("snapshot");
    }
    if sh.durable.is_none() {
        return super::snap::manage(sh, &ops);
    }
    let d = needs_durable(sh)?;
    let mut buf = Vec::new();
    let r = match ops.as_slice() {
        ["create", n] => d.snapshot_create(n),
        ["delete", n] => d.snapshot_delete(n),
        _ => d.snapshot_list(&mut buf),
    };
    r.map_err(|e| super::CmdError(format!("{e:#}")))?;
    // The durable snapshot (a pinned commit) is mirrored by an engine one of
    // the same name, so that `ls .snapshots/NAME` is instant here too; a
    // session reopened by a rollback starts with none.
    match ops.as_slice() {
        ["create", n] => {
            let _ = sh.fs.snapshot_create(n.as_bytes());
        }
        ["delete", n] => {
            let _ = sh.fs.snapshot_delete(n.as_bytes());
        }
        _ => {}
    }
    sh.out.write_all(&buf)?;
    Ok(())
}

fn rollback(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[("--to", true)])?;
    let Some(to) = o.value("--to") else {
        return usage("rollback");
    };
    if !o.operands.is_empty() {
        return usage("rollback");
    }
    if sh.durable.is_none() {
        return super::snap::rollback(sh, to);
    }
    let d = needs_durable(sh)?;
    let fs = d
        .rollback(to)
        .map_err(|e| super::CmdError(format!("{e:#}")))?;
    sh.fs = fs;
    sh.cwd
        .store(memfs_fs::ROOT_INO, std::sync::atomic::Ordering::Release);
    Ok(())
}

fn diff(sh: &mut Shell, args: &[String]) -> CmdResult {
    let o = Opts::parse(args, &[])?;
    match o.operands.as_slice() {
        [a] => super::snap::diff(sh, a, "-"),
        [a, b] => super::snap::diff(sh, a, b),
        _ => usage("diff"),
    }
}

// ---- session --------------------------------------------------------------------------

fn help(sh: &mut Shell, args: &[String]) -> CmdResult {
    match args {
        [] => {
            writeln!(
                sh.out,
                "Commands (help COMMAND for details; quote names with spaces):"
            )?;
            for s in COMMANDS {
                if s.usage.len() > 52 {
                    writeln!(sh.out, "  {}\n  {:<52} {}", s.usage, "", s.summary)?;
                } else {
                    writeln!(sh.out, "  {:<52} {}", s.usage, s.summary)?;
                }
            }
            Ok(())
        }
        [name] => {
            let Some(s) = spec(name) else {
                return err(format!("no such command: {name}"));
            };
            writeln!(sh.out, "usage: {}", s.usage)?;
            writeln!(sh.out, "{}", s.summary)?;
            if !s.details.is_empty() {
                writeln!(sh.out, "{}", s.details)?;
            }
            Ok(())
        }
        _ => usage("help"),
    }
}

fn clear(sh: &mut Shell, args: &[String]) -> CmdResult {
    if !args.is_empty() {
        return usage("clear");
    }
    if sh.interactive {
        write!(sh.out, "\x1b[H\x1b[2J\x1b[3J")?;
    }
    Ok(())
}

fn exit(sh: &mut Shell, args: &[String]) -> CmdResult {
    let code = match args {
        [] => 0,
        [c] => c
            .parse::<i32>()
            .ok()
            .filter(|c| (0..=255).contains(c))
            .ok_or_else(|| super::CmdError(format!("invalid status: {c}")))?,
        _ => return usage("exit"),
    };
    sh.exit = Some(code);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match(b"*.txt", b"a.txt"));
        assert!(!glob_match(b"*.txt", b"a.txt.bak"));
        assert!(glob_match(b"a?c", b"abc"));
        assert!(glob_match(b"[a-c]x", b"bx"));
        assert!(!glob_match(b"[!a-c]x", b"bx"));
        assert!(glob_match(b"*", b""));
        assert!(glob_match(b"*a*b*", b"xxaxxbxx"));
        assert!(!glob_match(b"*a*b", b"xxaxxbxx"));
        assert!(glob_match(b"[x", b"[x"));
    }
}
