//! `memfs shell` through the real binary: scripted sessions (every command and
//! every error path), parallel `-n` forms against sequential ones, and the
//! interactive mode through a pseudo-terminal.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_memfs");

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `memfs shell ARGS` with `stdin` piped in (so not a terminal).
fn shell(args: &[&str], stdin: &str) -> Out {
    let mut child = Command::new(BIN)
        .arg("shell")
        .args(args)
        .env("MEMFS_HISTORY", "")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memfs shell");
    // A failing write (the shell exited early) is fine: the output says why.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().expect("wait for memfs shell");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `memfs shell -c SCRIPT`.
fn c(script: &str) -> Out {
    shell(&["-c", script], "")
}

/// Runs a script that must succeed; returns its standard output.
fn ok(script: &str) -> String {
    let o = c(script);
    assert_eq!(o.code, 0, "script failed: {script}\nstderr: {}", o.stderr);
    assert_eq!(o.stderr, "", "unexpected errors for {script}");
    o.stdout
}

#[test]
fn classic_commands() {
    let out = ok(
        "create a b 'my file'; write a hello; write a ' world'; write 'my file' 'spaced out'; \
                  read a; read 'my file'; ls; delete b; ls",
    );
    assert_eq!(
        out,
        "hello world\nspaced out\na\nb\n'my file'\na\n'my file'\n"
    );
    // --at overwrites in place, and extends past the end.
    let out = ok("write f abcdef; write --at 2 f XY; read f; write --at=8 f Z; stat f");
    assert!(out.starts_with("abXYef\n"), "{out}");
    assert!(out.contains("Size: 9 "), "{out}");
    // ls -l: type and mode, links, owner, size, time, name; symlinks show their target.
    let out = ok("write f 12345; mkdir d; ln -s f l; chmod 600 f; ls -l");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("drwxr-xr-x   2 ") && lines[0].ends_with(" d"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("-rw-------   1 ") && lines[1].contains(" 5 "),
        "{out}"
    );
    assert!(lines[1].ends_with(" f"), "{out}");
    assert!(
        lines[2].starts_with("lrwxrwxrwx") && lines[2].ends_with(" l -> f"),
        "{out}"
    );
    let out = ok("mkdir d; ls -a d; ls d; touch d/x; ls d /d");
    assert_eq!(out, ".\n..\nd:\nx\n\n/d:\nx\n");
    // Aliases.
    assert_eq!(ok("write x 1; cat x; rm x; ls"), "1\n");
}

#[test]
fn everyday_commands() {
    let out = ok("mkdir -p a/b/c; cd a/b; pwd; write c/f data; cd ..; pwd; cd; pwd; read a/b/c/f");
    assert_eq!(out, "/a/b\n/a\n/\ndata\n");
    // pwd follows renames of an ancestor, and a new directory of the old name is not it.
    let out = ok("mkdir -p a/b; cd a/b; pwd; mv /a /z; pwd; mkdir -p /a/b; pwd; cd /a/b; pwd");
    assert_eq!(out, "/a/b\n/z/b\n/z/b\n/a/b\n");
    let o = c("mkdir d; cd d; pwd; rmdir /d; mkdir /d; pwd");
    assert_eq!((o.code, o.stdout.as_str()), (1, "/d\n"));
    let out = ok("mkdir d e; rmdir d; ls; mv e f; ls; write x 1; mv x f; ls f; mv f/x y; ls");
    assert_eq!(out, "e\nf\nx\nf\ny\n");
    // cp: files keep contents, mode and xattrs; -r copies trees, symlinks as symlinks.
    let out = ok(
        "mkdir -p src/sub; write src/sub/f deep; chmod 600 src/sub/f; xattr set src/sub/f user.k v; \
                  ln -s sub/f src/l; cp -r src dst; read dst/sub/f; read dst/l; xattr get dst/sub/f user.k; \
                  ls -l dst/sub; cp src/sub/f g; read g; mkdir into; cp g src/sub/f into; ls into",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..3], &["deep", "deep", "v"], "{out}");
    assert!(lines[3].starts_with("-rw-------"), "{out}");
    assert_eq!(&lines[4..], &["deep", "f", "g"], "{out}");
    // ln: hard links share the inode; ln into a directory keeps the name.
    let out = ok("write f 1; ln f g; write g 2; read f; mkdir d; ln -s /f d; read d/f; stat g");
    assert!(out.starts_with("12\n12\n"), "{out}");
    assert!(out.contains("Links: 2"), "{out}");
    // stat of a symlink describes the link.
    let out = ok("write f 1; ln -s f l; stat l");
    assert!(
        out.contains("File: l -> f") && out.contains("symbolic link"),
        "{out}"
    );
    // truncate extends with zeros, shrinks, creates; sizes take suffixes.
    let out = ok("write f abcdef; truncate -s 3 f; read f; truncate -s 1K f new; stat f; stat new");
    assert!(out.starts_with("abc\n"), "{out}");
    assert_eq!(out.matches("Size: 1024 ").count(), 2, "{out}");
    // chmod and touch.
    let out = ok("touch t; chmod 4755 t; stat t; touch t; ls");
    assert!(out.contains("(4755/-rwsr-xr-x)"), "{out}");
    assert!(out.ends_with("t\n"), "{out}");
    // tree, du, df, find.
    let out = ok("mkdir -p a/b; write a/b/f 1; write a/g 22; ln -s g a/l; tree a");
    assert_eq!(
        out,
        "a\n├── b\n│   └── f\n├── g\n└── l -> g\n\n1 directory, 3 files\n"
    );
    let out = ok("mkdir a; write a/f 12345; ln a/f a/g; du a");
    assert!(out.starts_with("4.0K\t"), "hard links count once: {out}");
    let out = ok("df");
    assert!(out.starts_with("    Size     Used    Avail  Use%"), "{out}");
    let out = ok(
        "mkdir -p a/b; write a/x.txt 1; write a/b/y.txt 2; write a/b/z.md 3; \
                  find '*.txt'; find a/b '[yz].*'; find / 'x*'",
    );
    assert_eq!(
        out,
        "./a/b/y.txt\n./a/x.txt\na/b/y.txt\na/b/z.md\n/a/x.txt\n"
    );
    // xattr.
    let out = ok(
        "write f 1; xattr set f user.b 2; xattr set f user.a 'one two'; xattr list f; \
                  xattr get f user.a; xattr rm f user.b; xattr list f",
    );
    assert_eq!(out, "user.a\nuser.b\none two\nuser.a\n");
    // help and clear.
    let out = ok("help; help write; clear");
    assert!(out.contains("create [-n N] FILE...") && out.contains("import HOSTPATH [PATH]"));
    assert!(out.contains("usage: write [-n N] [--at OFFSET] FILE TEXT [FILE TEXT...]"));
}

#[test]
fn import_and_export_round_trip() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tree");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::write(src.join("a.txt"), b"alpha").unwrap();
    let big: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(src.join("sub/big.bin"), &big).unwrap();
    std::fs::write(src.join("sub/deeper/name with space"), b"s").unwrap();
    std::fs::set_permissions(src.join("a.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();
    let dst = tmp.path().join("out");
    let script = format!(
        "import {src} /in; ls -l /in/a.txt; read /in/link; tree /in; export /in {dst}; \
         mkdir /d; import {file} /d; read /d/a.txt",
        src = src.display(),
        dst = dst.display(),
        file = src.join("a.txt").display()
    );
    let out = ok(&script);
    assert!(out.starts_with("-rw-------"), "{out}");
    assert!(out.contains("alpha\n"), "{out}");
    assert!(out.contains("name with space"), "{out}");
    assert!(out.ends_with("alpha\n"), "{out}");
    assert_eq!(std::fs::read(dst.join("sub/big.bin")).unwrap(), big);
    assert_eq!(std::fs::read(dst.join("a.txt")).unwrap(), b"alpha");
    assert_eq!(
        std::fs::read(dst.join("sub/deeper/name with space")).unwrap(),
        b"s"
    );
    assert_eq!(
        std::fs::read_link(dst.join("link")).unwrap(),
        Path::new("a.txt")
    );
    let mode = std::fs::metadata(dst.join("a.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // Exporting into an existing host directory puts the node inside it.
    let o = ok(&format!("write f x; export f {}", tmp.path().display()));
    assert_eq!(o, "");
    assert_eq!(std::fs::read(tmp.path().join("f")).unwrap(), b"x");
}

/// Every error path: one line `command: what: path` on standard error, exit
/// status 1, and nothing after the failing command runs.
#[test]
fn errors_are_one_clear_line() {
    let cases: &[(&str, &str)] = &[
        ("read a.txt", "read: no such file: a.txt"),
        ("mkdir d; read d", "read: is a directory: d"),
        ("read", "read: usage: read FILE..."),
        ("create a; create a", "create: already exists: a"),
        ("create", "create: usage: create [-n N] FILE..."),
        ("create nodir/a", "create: no such file: nodir/a"),
        (
            "create -n 2 a",
            "create: -n 2 does not match the 1 name given",
        ),
        ("create -n 0 a", "create: -n needs a positive number, not 0"),
        (
            "create -n x a",
            "create: -n needs a positive number, not \"x\"",
        ),
        ("create -n", "create: option -n needs a value"),
        ("create -q a", "create: unknown option: -q"),
        (
            "write a",
            "write: usage: write [-n N] [--at OFFSET] FILE TEXT [FILE TEXT...]",
        ),
        ("mkdir d; write d x", "write: is a directory: d"),
        ("write --at -1 a x", "write: invalid offset: -1"),
        (
            "write -n 3 a x b y",
            "write: -n 3 does not match the 2 names given",
        ),
        ("delete a", "delete: no such file: a"),
        ("mkdir d; delete d", "delete: is a directory (use rmdir): d"),
        ("ls nope", "ls: no such file: nope"),
        ("mkdir d; mkdir d", "mkdir: already exists: d"),
        ("mkdir a/b", "mkdir: no such file: a/b"),
        ("write f x; mkdir -p f/g", "mkdir: not a directory: f/g"),
        ("mkdir -p d/e; rmdir d", "rmdir: directory not empty: d"),
        ("rmdir d", "rmdir: no such file: d"),
        ("write f x; rmdir f", "rmdir: not a directory: f"),
        ("cd nope", "cd: no such file: nope"),
        ("write f x; cd f", "cd: not a directory: f"),
        ("cd a b", "cd: usage: cd [DIR]"),
        ("pwd x", "pwd: usage: pwd"),
        (
            "mkdir d; cd d; rmdir /d; pwd",
            "pwd: the current directory was removed (cd / to leave it)",
        ),
        ("mv a b", "mv: no such file: a"),
        ("mv a", "mv: usage: mv SOURCE... DEST"),
        (
            "mkdir -p d/e; mv d d/e",
            "mv: cannot move a directory into itself: d",
        ),
        ("write a 1; write b 2; mv a b c", "mv: not a directory: c"),
        ("mkdir d; cp d e", "cp: is a directory (use cp -r): d"),
        ("cp a b", "cp: no such file: a"),
        (
            "mkdir d; cp -r d d/e",
            "cp: cannot copy a directory into itself: d",
        ),
        ("write a 1; cp a a", "cp: a and a are the same file"),
        ("write a 1; write b 2; ln a b", "ln: already exists: b"),
        ("mkdir d; ln d e", "ln: cannot hard-link a directory: d"),
        ("ln a b", "ln: no such file: a"),
        ("ln a", "ln: usage: ln [-s] TARGET LINK"),
        ("stat a", "stat: no such file: a"),
        ("truncate -s 1Q f", "truncate: invalid size: 1Q"),
        ("truncate f", "truncate: usage: truncate -s SIZE FILE..."),
        ("mkdir d; truncate -s 1 d", "truncate: is a directory: d"),
        (
            "write f 1; chmod u+x f",
            "chmod: invalid mode (use octal, e.g. 644): u+x",
        ),
        ("chmod 644 f", "chmod: no such file: f"),
        ("touch a/b", "touch: no such file: a/b"),
        ("tree nope", "tree: no such file: nope"),
        ("du nope", "du: no such file: nope"),
        ("df x", "df: usage: df"),
        ("find nope '*'", "find: no such file: nope"),
        ("find", "find: usage: find [DIR] NAME-PATTERN"),
        ("write f x; find f '*'", "find: not a directory: f"),
        (
            "import /nonexistent/x",
            "import: no such file: /nonexistent/x (host)",
        ),
        ("export nope /tmp/x", "export: no such file: nope"),
        (
            "write f x; export f /nonexistent/dir/f",
            "export: no such file: /nonexistent/dir/f (host)",
        ),
        (
            "write f x; xattr get f user.k",
            "xattr: no such attribute: user.k on f",
        ),
        (
            "write f x; xattr rm f user.k",
            "xattr: no such attribute: user.k on f",
        ),
        ("xattr list nope", "xattr: no such file: nope"),
        (
            "write f x; xattr set f bogus v",
            "xattr: unsupported attribute name (use a namespace such as user.): bogus",
        ),
        (
            "xattr frob",
            "xattr: usage: xattr get PATH NAME | set PATH NAME VALUE | list PATH | rm PATH NAME",
        ),
        (
            "log",
            "log: this session is in memory only: start the shell with --data-dir PATH for a durable memfs",
        ),
        (
            "snapshot create s; snapshot create s",
            "snapshot: a snapshot named s exists already",
        ),
        (
            "snapshot create ..",
            "snapshot: bad snapshot name \"..\": 1-255 bytes, no '/', not . or ..",
        ),
        ("snapshot delete s", "snapshot: no snapshot named s"),
        ("ls .snapshots/s", "ls: no such file: .snapshots/s"),
        (
            "snapshot create s; read .snapshots/s",
            "read: is a directory: .snapshots/s",
        ),
        ("diff s", "diff: no snapshot named s"),
        ("diff", "diff: usage: diff SNAPSHOT [SNAPSHOT | -]"),
        (
            "snapshot frob",
            "snapshot: usage: snapshot create NAME | list | delete NAME",
        ),
        ("rollback --to s", "rollback: no snapshot named s"),
        ("rollback", "rollback: usage: rollback --to SNAPSHOT"),
        ("help frob", "help: no such command: frob"),
        ("clear x", "clear: usage: clear"),
        ("exit 300", "exit: invalid status: 300"),
        ("frob a", "frob: unknown command (type help for the list)"),
        (
            "write 'a b",
            "memfs shell: syntax error: unterminated single quote",
        ),
        (
            "write \"a b",
            "memfs shell: syntax error: unterminated double quote",
        ),
    ];
    for (script, want) in cases {
        // A marker after the failing command must not run.
        let o = c(&format!("{script}\nwrite /marker x"));
        assert_eq!(o.code, 1, "exit status for {script:?}: {}", o.stderr);
        assert_eq!(o.stderr, format!("{want}\n"), "stderr for {script:?}");
        assert!(!o.stdout.contains("marker"), "{script:?}");
    }
}

#[test]
fn failing_scripts_stop_unless_keep_going() {
    let o = c("write a 1; read nope; write b 2; ls");
    assert_eq!((o.code, o.stdout.as_str()), (1, ""));
    let o = shell(
        &[
            "--keep-going",
            "-c",
            "write a 1; read nope; write b 2; delete x y; ls",
        ],
        "",
    );
    assert_eq!(o.code, 1);
    assert_eq!(o.stdout, "a\nb\n");
    assert_eq!(
        o.stderr,
        "read: no such file: nope\ndelete: no such file: x\ndelete: no such file: y\n"
    );
    // exit ends the session with its status; later commands do not run.
    let o = c("write a 1; exit 3; write b 2");
    assert_eq!(o.code, 3);
    let o = c("exit; read nope");
    assert_eq!((o.code, o.stderr.as_str()), (0, ""));
}

#[test]
fn script_files_and_pipes() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("s.memfs");
    std::fs::write(
        &script,
        "# a comment\nmkdir docs\nwrite docs/n 'line one\nline two'\nread docs/n\nls docs # trailing\n",
    )
    .unwrap();
    let o = shell(&[script.to_str().unwrap()], "");
    assert_eq!((o.code, o.stderr.as_str()), (0, ""));
    assert_eq!(o.stdout, "line one\nline two\nn\n");
    // Standard input that is not a terminal is a script too, read as it comes.
    let o = shell(&[], "write f 'multi\nline'\nread f\nread nope\nread f\n");
    assert_eq!(o.code, 1);
    assert_eq!(o.stdout, "multi\nline\n");
    assert_eq!(o.stderr, "read: no such file: nope\n");
    let o = shell(&["--keep-going"], "read nope\nwrite f x\nread f\n");
    assert_eq!((o.code, o.stdout.as_str()), (1, "x\n"));
    // A missing script file is a clear error.
    let o = shell(&["/nonexistent/script"], "");
    assert_ne!(o.code, 0);
    assert!(
        o.stderr.contains("cannot open script /nonexistent/script"),
        "{}",
        o.stderr
    );
}

#[test]
fn a_data_dir_keeps_the_tree_across_sessions_and_rolls_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let d = dir.to_str().unwrap();
    let o = shell(
        &[
            "--data-dir",
            d,
            "-c",
            "mkdir /a; write /a/f one; snapshot create s1; write /a/f two; write /a/g three",
        ],
        "",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    // A second session sees everything.
    let o = shell(
        &[
            "--data-dir",
            d,
            "-c",
            "cat /a/f; cat /a/g; snapshot list; log -n 2",
        ],
        "",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.starts_with("onetwo\nthree\ns1 commit "),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("write"), "{}", o.stdout);
    // Roll back inside a session: the tree is the snapshot's.
    let o = shell(
        &[
            "--data-dir",
            d,
            "--keep-going",
            "-c",
            "rollback --to s1; cat /a/f; cat /a/g",
        ],
        "",
    );
    assert_eq!(o.stdout, "one\n", "{}", o.stderr);
    assert!(o.stderr.contains("cat: no such file: /a/g"), "{}", o.stderr);
    // And it stays rolled back.
    let o = shell(&["--data-dir", d, "-c", "cat /a/f"], "");
    assert_eq!((o.code, o.stdout.as_str()), (0, "one\n"), "{}", o.stderr);
    // Bad input: an unknown snapshot, a bad mode.
    let o = shell(&["--data-dir", d, "-c", "rollback --to nope"], "");
    assert_ne!(o.code, 0);
    assert!(
        o.stderr.contains("neither a commit id nor a snapshot name"),
        "{}",
        o.stderr
    );
    let o = shell(&["--data-dir", d, "--durability", "fast", "-c", "ls"], "");
    assert_ne!(o.code, 0);
    assert!(o.stderr.contains("invalid durability"), "{}", o.stderr);
}

#[test]
fn copy_on_write_snapshots_without_a_data_dir() {
    // Taken, browsed, compared and rolled back to in one in-memory session.
    let out = ok(
        "mkdir /a; write /a/f one; write /a/g keep; snapshot create s1; \
         write /a/f ' two'; delete /a/g; write /a/h new; \
         ls .snapshots; ls /.snapshots/s1/a; read .snapshots/s1/a/f; read /a/f; \
         diff s1; rollback --to s1; ls /a; read /a/f; diff s1; \
         ls .snapshots/s1/a",
    );
    assert_eq!(
        out,
        "s1\nf\ng\none\none two\n\
         M /a\nM /a/f\n- /a/g\n+ /a/h\n\
         f\ng\none\n\
         f\ng\n"
    );
    // From a subdirectory only an absolute path reaches .snapshots; a
    // deleted snapshot is gone from the listing.
    let out = ok(
        "mkdir /d; write /d/x 1; snapshot create a; snapshot create b; cd /d; \
         read /.snapshots/a/d/x; snapshot delete a; ls /.snapshots",
    );
    assert_eq!(out, "1\nb\n");
}

#[test]
fn size_limits_give_clear_errors() {
    let o = shell(
        &[
            "--size",
            "64K",
            "-c",
            "truncate -s 1M f; write --at 0 f x; write g 1",
        ],
        "",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let big = "y".repeat(100_000);
    let o = shell(&["--size", "64K", "-c", &format!("write h {big}")], "");
    assert_eq!(
        (o.code, o.stderr.as_str()),
        (1, "write: no space left on the file system: h\n")
    );
    let o = shell(&["--inodes", "3", "-c", "create a b c"], "");
    assert_eq!(o.code, 1);
    assert_eq!(o.stderr, "create: no space left on the file system: c\n");
}

/// The `-n N` forms run on worker threads; their results must be the ones of
/// the sequential forms.
#[test]
fn parallel_forms_match_sequential() {
    let names: Vec<String> = (0..64).map(|i| format!("'file {i}'")).collect();
    let all = names.join(" ");
    let pairs: String = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!(" {n} 'text {i}'"))
        .collect();
    let reads: String = names.iter().map(|n| format!("read {n}; ")).collect();
    let half = names[..32].join(" ");
    let body = |n: Option<usize>| {
        let flag = |k: usize| n.map_or(String::new(), |_| format!("-n {k} "));
        format!(
            "create {f64}{all}; write {f64}{pairs}; write {f64}{pairs}; {reads} ls -l; \
             delete {f32}{half}; ls",
            f64 = flag(64),
            f32 = flag(32),
        )
    };
    let strip_times = |s: &str| -> String {
        s.lines()
            .map(|l| {
                if l.starts_with('-') {
                    // Drop the time columns of ls -l: they differ between runs.
                    let w: Vec<&str> = l.split_whitespace().collect();
                    format!("{} {}", w[..5].join(" "), w[7..].join(" "))
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let seq = ok(&body(None));
    let par = ok(&body(Some(64)));
    assert!(seq.contains("text 63text 63\n"), "{seq}");
    assert_eq!(strip_times(&seq), strip_times(&par));
    // Partial failures: the same lines in the same order.
    let fail = |n: &str| c(&format!("create a c; create {n}a b c d; delete {n}a b c e"));
    let (s, p) = (fail(""), fail("-n 4 "));
    assert_eq!(s.code, 1);
    assert_eq!(
        s.stderr,
        "create: already exists: a\ncreate: already exists: c\n"
    );
    let fail = |n: &str| {
        shell(
            &[
                "--keep-going",
                "-c",
                &format!("create a c; create {n}a b c d; delete {n}a b c e"),
            ],
            "",
        )
    };
    let (s2, p2) = (fail(""), fail("-n 4 "));
    assert_eq!(s2.stderr.lines().last(), Some("delete: no such file: e"));
    assert_eq!((s2.code, s2.stderr), (p2.code, p2.stderr));
    assert_eq!((s.code, s.stderr), (p.code, p.stderr));
}

mod interactive {
    use super::BIN;
    use rexpect::session::{PtySession, spawn_command};
    use std::process::Command;

    const PROMPT: &str = "memfs:/> ";

    /// Types `s` (rexpect buffers `send` until a flush).
    fn typ(p: &mut PtySession, s: &str) {
        p.send(s).unwrap();
        p.flush().unwrap();
    }

    fn start(home: &std::path::Path) -> PtySession {
        let mut cmd = Command::new(BIN);
        cmd.arg("shell")
            .env("HOME", home)
            .env("MEMFS_HISTORY", home.join("history"))
            .env("TERM", "xterm");
        // Every expectation polls the terminal output with this timeout and
        // fails loudly when it runs out; dropping the session kills the child.
        spawn_command(cmd, Some(15_000)).expect("spawn memfs shell on a pty")
    }

    #[test]
    fn completion_history_ctrl_c_ctrl_d() {
        let home = tempfile::tempdir().unwrap();
        let mut p = start(home.path());
        p.exp_string(PROMPT).unwrap();
        p.send_line("write 'hello world.txt' greetings; mkdir subdir")
            .unwrap();
        p.exp_string(PROMPT).unwrap();
        // Tab completes the command, then the path (escaping the space).
        typ(&mut p, "rea\t");
        p.exp_string("read ").unwrap();
        typ(&mut p, "hel\t");
        p.exp_string("txt").unwrap();
        typ(&mut p, "\r");
        p.exp_string("greetings").unwrap();
        p.exp_string(PROMPT).unwrap();
        // Directories complete with a slash.
        typ(&mut p, "cd sub\t");
        p.exp_string("subdir/").unwrap();
        typ(&mut p, "\r");
        p.exp_string("memfs:/subdir> ").unwrap();
        p.send_line("cd /").unwrap();
        p.exp_string(PROMPT).unwrap();
        // History: Ctrl-P three times recalls the read command.
        for _ in 0..3 {
            p.send_control('p').unwrap();
        }
        p.exp_string("hello\\ world.txt").unwrap();
        typ(&mut p, "\r");
        p.exp_string("greetings").unwrap();
        p.exp_string(PROMPT).unwrap();
        // Ctrl-C cancels the line being typed: the file survives.
        typ(&mut p, "delete hello\\ world.txt");
        p.exp_string("world.txt").unwrap();
        p.send_control('c').unwrap();
        p.exp_string(PROMPT).unwrap();
        p.send_line("ls").unwrap();
        p.exp_string("'hello world.txt'").unwrap();
        p.exp_string(PROMPT).unwrap();
        // An error is one line and the session goes on.
        p.send_line("read nope").unwrap();
        p.exp_string("read: no such file: nope").unwrap();
        p.exp_string(PROMPT).unwrap();
        // An open quote continues on the next line.
        p.send_line("write q 'two").unwrap();
        p.send_line("lines'; read q").unwrap();
        p.exp_string("two\r\nlines").unwrap();
        p.exp_string(PROMPT).unwrap();
        // Ctrl-D on an empty line leaves with status 0 and saves the history.
        p.send_control('d').unwrap();
        p.exp_eof().unwrap();
        let status = p.process().wait().unwrap();
        assert_eq!(
            status,
            rexpect::process::wait::WaitStatus::Exited(p.process().child_pid, 0)
        );
        let history = std::fs::read_to_string(home.path().join("history")).unwrap();
        assert!(
            history.contains("write 'hello world.txt' greetings"),
            "{history}"
        );
        assert!(
            !history.contains("delete"),
            "a cancelled line is not history: {history}"
        );

        // The next session starts with that history.
        let mut p = start(home.path());
        p.exp_string(PROMPT).unwrap();
        p.send_control('p').unwrap();
        p.exp_string("read q").unwrap();
        p.send_control('c').unwrap();
        p.exp_string(PROMPT).unwrap();
        p.send_line("exit").unwrap();
        p.exp_eof().unwrap();
    }
}

/// `memfs bench workload` end to end, tiny: the table, the JSON and the
/// issue's checks are all there, and bad arguments are clear errors.
#[test]
fn workload_benchmark_smoke() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("w.json");
    let base = tmp.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let out = Command::new(BIN)
        .args(["bench", "workload", "--ops", "10,30", "--threads", "1,3"])
        .args(["--runs", "1", "--warmup", "0", "--baseline"])
        .arg(&base)
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(tmp.path().join("w"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("memfs engine (in process)"), "{stdout}");
    assert!(stdout.contains("memory for 10,000 small files"), "{stdout}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let results = v["results"].as_array().unwrap();
    // 2 targets x 2 op counts x 2 thread counts x 4 phases.
    assert_eq!(results.len(), 32);
    assert!(
        results
            .iter()
            .all(|r| r["total_ms"].as_f64().unwrap() > 0.0)
    );
    assert_eq!(
        std::fs::read_dir(&base).unwrap().count(),
        0,
        "baseline files removed"
    );
    let bad = Command::new(BIN)
        .args(["bench", "workload", "--threads", "0"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--threads needs positive counts"));
}
