//! Splitting shell input into commands and words with POSIX-shell quoting.
//!
//! Supported: single quotes (literal), double quotes (with `\"`, `\\`, `\$`
//! and `` \` `` escapes), backslash escapes outside quotes, `;` and newlines
//! between commands, and `#` comments at the start of a word. No expansion:
//! the shell has no variables, globs or pipes, so `$` and `*` are plain text.

/// Why some input could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The input ends inside a quote or after a trailing backslash: more input
    /// may complete it (the interactive mode asks for a continuation line).
    Incomplete(&'static str),
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Incomplete(what) => write!(f, "syntax error: {what}"),
        }
    }
}

/// Splits `input` into commands (each a non-empty list of words).
pub fn parse(input: &str) -> Result<Vec<Vec<String>>, ParseError> {
    let mut commands = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    // A word exists once any character or quote was seen: `''` is an empty word.
    let mut in_word = false;
    let mut chars = input.chars().peekable();
    let end_word = |words: &mut Vec<String>, word: &mut String, in_word: &mut bool| {
        if *in_word {
            words.push(std::mem::take(word));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\r' => end_word(&mut words, &mut word, &mut in_word),
            '\n' | ';' => {
                end_word(&mut words, &mut word, &mut in_word);
                if !words.is_empty() {
                    commands.push(std::mem::take(&mut words));
                }
            }
            '#' if !in_word => {
                // A comment runs to the end of the line.
                while let Some(&n) = chars.peek() {
                    if n == '\n' {
                        break;
                    }
                    chars.next();
                }
            }
            '\'' => {
                in_word = true;
                single_quoted(&mut chars, &mut word)?;
            }
            '"' => {
                in_word = true;
                double_quoted(&mut chars, &mut word)?;
            }
            '\\' => match chars.next() {
                // A backslash-newline joins lines.
                Some('\n') => {}
                Some(x) => {
                    in_word = true;
                    word.push(x);
                }
                None => return Err(ParseError::Incomplete("trailing backslash")),
            },
            x => {
                in_word = true;
                word.push(x);
            }
        }
    }
    end_word(&mut words, &mut word, &mut in_word);
    if !words.is_empty() {
        commands.push(words);
    }
    Ok(commands)
}

/// The rest of a single-quoted string, up to its closing quote, onto `word`:
/// nothing is special inside.
fn single_quoted(
    chars: &mut impl Iterator<Item = char>,
    word: &mut String,
) -> Result<(), ParseError> {
    loop {
        match chars.next() {
            Some('\'') => return Ok(()),
            Some(x) => word.push(x),
            None => return Err(ParseError::Incomplete("unterminated single quote")),
        }
    }
}

/// The rest of a double-quoted string, up to its closing quote, onto `word`,
/// with the escapes the module names.
fn double_quoted(
    chars: &mut impl Iterator<Item = char>,
    word: &mut String,
) -> Result<(), ParseError> {
    loop {
        match chars.next() {
            Some('"') => return Ok(()),
            Some('\\') => match chars.next() {
                Some(x @ ('"' | '\\' | '$' | '`')) => word.push(x),
                Some('\n') => {}
                Some(x) => {
                    word.push('\\');
                    word.push(x);
                }
                None => return Err(ParseError::Incomplete("unterminated double quote")),
            },
            Some(x) => word.push(x),
            None => return Err(ParseError::Incomplete("unterminated double quote")),
        }
    }
}

/// Quotes `s` so that [`parse`] gives it back as one word.
pub fn quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./+,:=@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<Vec<String>> {
        parse(s).unwrap()
    }

    #[test]
    fn words_and_commands() {
        assert_eq!(p("ls -l /a"), vec![vec!["ls", "-l", "/a"]]);
        assert_eq!(p("a; b c\nd"), vec![vec!["a"], vec!["b", "c"], vec!["d"]]);
        assert_eq!(p("  ;; \n "), Vec::<Vec<String>>::new());
        assert_eq!(p("echo a#b # comment; x"), vec![vec!["echo", "a#b"]]);
    }

    #[test]
    fn quoting() {
        assert_eq!(
            p(r#"write "my file" 'it''s'"#),
            vec![vec!["write", "my file", "its"]]
        );
        assert_eq!(p(r#"w "a \"b\" \n""#), vec![vec!["w", r#"a "b" \n"#]]);
        assert_eq!(p(r"a\ b c\;d"), vec![vec!["a b", "c;d"]]);
        assert_eq!(p("x '' \"\""), vec![vec!["x", "", ""]]);
        assert_eq!(p("w 'a;b\nc'"), vec![vec!["w", "a;b\nc"]]);
        assert_eq!(p("a\\\nb"), vec![vec!["ab"]]);
    }

    #[test]
    fn incomplete_input() {
        assert!(matches!(parse("w 'abc"), Err(ParseError::Incomplete(_))));
        assert!(matches!(parse("w \"abc"), Err(ParseError::Incomplete(_))));
        assert!(matches!(parse("w abc\\"), Err(ParseError::Incomplete(_))));
    }

    #[test]
    fn quote_round_trips() {
        for s in ["plain", "with space", "it's", "", "a\"b", "x;y", "$HOME"] {
            assert_eq!(
                p(&format!("c {}", quote(s))),
                vec![vec!["c".to_string(), s.to_string()]]
            );
        }
    }
}
