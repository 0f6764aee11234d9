//! The interactive mode: line editing, history and tab completion (rustyline).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memfs_fs::{FileType, Fs};
use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{CompletionType, Config, Context, Editor, Helper};

use super::commands::command_names;
use super::{ParseError, Shell, parse};

/// Completes command names in first position and memfs paths elsewhere.
struct ShellHelper {
    fs: Arc<Fs>,
    cwd: Arc<AtomicU64>,
}

/// Backslash-escapes what the parser would otherwise split or interpret.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_whitespace() || "'\"\\;#$`&|<>()*?[]{}!~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Where the word under the cursor starts, and whether it is a command name.
fn current_word(line: &str) -> (usize, bool) {
    let (mut start, mut first) = (0, true);
    let mut words_before = 0;
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => escaped = true,
            (Some(_), _) => {}
            (None, '\\') => {
                escaped = true;
                if !in_word {
                    in_word = true;
                    start = i;
                }
            }
            (None, '\'' | '"') => {
                quote = Some(c);
                if !in_word {
                    in_word = true;
                    start = i;
                }
            }
            (None, ' ' | '\t' | '\n') => {
                if in_word {
                    words_before += 1;
                }
                in_word = false;
                start = i + 1;
            }
            (None, ';') => {
                in_word = false;
                words_before = 0;
                start = i + 1;
            }
            (None, _) => {
                if !in_word {
                    in_word = true;
                    start = i;
                }
            }
        }
        first = words_before == 0;
    }
    (start, first)
}

/// The word's text with quoting removed (closing an open quote first).
fn unquote(word: &str) -> String {
    for close in ["", "'", "\"", "\\"] {
        if let Ok(cmds) = parse(&format!("{word}{close}")) {
            return cmds
                .into_iter()
                .next()
                .and_then(|w| w.into_iter().next())
                .unwrap_or_default();
        }
    }
    String::new()
}

impl ShellHelper {
    fn complete_path(&self, word: &str) -> Vec<Pair> {
        let text = unquote(word);
        let (dir, prefix) = match text.rfind('/') {
            Some(i) => (&text[..=i], &text[i + 1..]),
            None => ("", text.as_str()),
        };
        let cwd = self.cwd.load(Ordering::Acquire);
        let Ok(dir_ino) = self
            .fs
            .resolve(cwd, if dir.is_empty() { "." } else { dir }, true)
        else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let _ = self.fs.readdir(dir_ino, 2, |e| {
            if e.name.starts_with(prefix.as_bytes()) {
                found.push((String::from_utf8_lossy(e.name).into_owned(), e.ino, e.kind));
            }
            true
        });
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
            .into_iter()
            .map(|(name, ino, kind)| {
                let is_dir = kind == FileType::Directory
                    || (kind == FileType::Symlink
                        && self
                            .fs
                            .resolve(dir_ino, &name, true)
                            .and_then(|i| self.fs.getattr(i))
                            .is_ok_and(|a| a.kind == FileType::Directory));
                let _ = ino;
                let slash = if is_dir { "/" } else { "" };
                Pair {
                    display: format!("{name}{slash}"),
                    replacement: format!("{}{slash}", escape(&format!("{dir}{name}"))),
                }
            })
            .collect()
    }
}

impl Completer for ShellHelper {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let (start, first) = current_word(&line[..pos]);
        let word = &line[start..pos];
        if first {
            let mut names: Vec<&str> = command_names().filter(|n| n.starts_with(word)).collect();
            names.sort_unstable();
            let pairs = names
                .into_iter()
                .map(|n| Pair {
                    display: n.to_string(),
                    replacement: format!("{n} "),
                })
                .collect();
            return Ok((start, pairs));
        }
        Ok((start, self.complete_path(word)))
    }
}

impl Hinter for ShellHelper {
    type Hint = String;
}

impl Highlighter for ShellHelper {}

impl Validator for ShellHelper {
    /// An open quote continues on the next line, as in a POSIX shell.
    fn validate(&self, ctx: &mut ValidationContext) -> rustyline::Result<ValidationResult> {
        Ok(match parse(ctx.input()) {
            Err(ParseError::Incomplete(_)) => ValidationResult::Incomplete,
            Ok(_) => ValidationResult::Valid(None),
        })
    }
}

impl Helper for ShellHelper {}

/// `$MEMFS_HISTORY`, or `~/.memfs_history`; none without a home.
fn history_path() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("MEMFS_HISTORY") {
        return (!p.is_empty()).then(|| p.into());
    }
    std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".memfs_history"))
}

pub fn run(shell: &mut Shell) -> anyhow::Result<()> {
    let config = Config::builder()
        .completion_type(CompletionType::List)
        .max_history_size(10_000)?
        .history_ignore_dups(true)?
        .build();
    let mut rl: Editor<ShellHelper, DefaultHistory> = Editor::with_config(config)?;
    rl.set_helper(Some(ShellHelper {
        fs: shell.fs.clone(),
        cwd: shell.cwd.clone(),
    }));
    let history = history_path();
    if let Some(h) = &history {
        // A missing history file is the normal first run.
        let _ = rl.load_history(h);
    }
    println!("memfs shell: an in-memory file system. Type help for the commands, Ctrl-D to leave.");
    loop {
        let dir = shell.cwd_path().unwrap_or_else(|_| "(removed)".into());
        match rl.readline(&format!("memfs:{dir}> ")) {
            Ok(line) => {
                if !line.trim().is_empty() {
                    let _ = rl.add_history_entry(line.as_str());
                }
                shell.run_text(&line, true);
                if shell.exit.is_some() {
                    break;
                }
            }
            // Ctrl-C drops the line being typed, as in bash.
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => {
                save(&mut rl, history.as_deref());
                return Err(e.into());
            }
        }
    }
    save(&mut rl, history.as_deref());
    Ok(())
}

fn save(rl: &mut Editor<ShellHelper, DefaultHistory>, path: Option<&std::path::Path>) {
    if let Some(p) = path
        && let Err(e) = rl.save_history(p)
    {
        tracing::warn!("cannot save history to {}: {e}", p.display());
    }
}
