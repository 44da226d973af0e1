//! llama.cpp's GBNF grammars as llguidance Lark: rule names become lowercase Lark rules
//! (prefixed, so no name clashes with Lark's keywords or its upper-case terminals), literals
//! JSON strings, character classes and `.` regexes; repetitions, groups and alternatives carry
//! over as they are. `root` is the start.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Name(String),
    Define,
    Str(String),
    /// A regex for a character class or `.`.
    Class(String),
    Open,
    Close,
    Bar,
    Op(char),
    /// `{m}`, `{m,}`, `{,n}`, `{m,n}` as written.
    Repeat(String),
}

/// Translates a GBNF grammar into llguidance's Lark dialect, or says what is wrong with it
/// (with the line).
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let toks = lex(src)?;
    let mut rules: BTreeMap<String, Vec<(Tok, usize)>> = BTreeMap::new();
    let mut order = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let (Tok::Name(name), line) = &toks[i] else {
            return Err(format!("line {}: expected a rule name", toks[i].1));
        };
        if toks.get(i + 1).map(|t| &t.0) != Some(&Tok::Define) {
            return Err(format!("line {line}: expected `::=` after `{name}`"));
        }
        let start = i + 2;
        let mut end = start;
        while end < toks.len()
            && !(matches!(toks[end].0, Tok::Name(_))
                && toks.get(end + 1).map(|t| &t.0) == Some(&Tok::Define))
        {
            end += 1;
        }
        if rules
            .insert(name.clone(), toks[start..end].to_vec())
            .is_some()
        {
            return Err(format!("line {line}: rule `{name}` is defined twice"));
        }
        order.push(name.clone());
        i = end;
    }
    if !rules.contains_key("root") {
        return Err("the grammar has no `root` rule".into());
    }
    let names = lark_names(&order);
    let mut out = String::from("start: ") + &names["root"] + "\n";
    for name in &order {
        out += &names[name];
        out += ": ";
        out += &body(&rules[name], &names, name)?;
        out += "\n";
    }
    Ok(out)
}

/// A distinct lowercase Lark rule name for each GBNF name.
fn lark_names(order: &[String]) -> BTreeMap<String, String> {
    let mut taken = BTreeSet::new();
    let mut names = BTreeMap::new();
    for n in order {
        let base: String = n
            .chars()
            .map(|c| match c.is_ascii_alphanumeric() {
                true => c.to_ascii_lowercase(),
                false => '_',
            })
            .collect();
        let mut cand = format!("g_{base}");
        let mut k = 1;
        while !taken.insert(cand.clone()) {
            cand = format!("g_{base}_{k}");
            k += 1;
        }
        names.insert(n.clone(), cand);
    }
    names
}

/// One rule's right-hand side in Lark.
fn body(
    toks: &[(Tok, usize)],
    names: &BTreeMap<String, String>,
    rule: &str,
) -> Result<String, String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    // Whether the last thing can take a repetition (an atom or a closed group).
    let mut atom = false;
    for (t, line) in toks {
        let piece = match t {
            Tok::Name(n) => match names.get(n) {
                Some(m) => m.clone(),
                None => return Err(format!("line {line}: rule `{n}` is used but not defined")),
            },
            Tok::Str(s) if s.is_empty() => "\"\"".into(),
            Tok::Str(s) => serde_json::to_string(s).expect("strings serialise"),
            Tok::Class(rx) => format!("/{rx}/"),
            Tok::Open => {
                depth += 1;
                "(".into()
            }
            Tok::Close => {
                if depth == 0 || !atom && out.last().is_some_and(|p: &String| p == "(") {
                    return Err(format!("line {line}: unbalanced `)` in rule `{rule}`"));
                }
                depth -= 1;
                ")".into()
            }
            Tok::Bar => "|".into(),
            Tok::Op(c) if !atom => {
                return Err(format!(
                    "line {line}: `{c}` follows nothing in rule `{rule}`"
                ))
            }
            Tok::Repeat(r) if !atom => {
                return Err(format!(
                    "line {line}: `{r}` follows nothing in rule `{rule}`"
                ))
            }
            Tok::Op(c) => c.to_string(),
            Tok::Repeat(r) => r.clone(),
            Tok::Define => return Err(format!("line {line}: unexpected `::=` in rule `{rule}`")),
        };
        atom = matches!(
            t,
            Tok::Name(_) | Tok::Str(_) | Tok::Class(_) | Tok::Close | Tok::Op(_) | Tok::Repeat(_)
        );
        out.push(piece);
    }
    if depth != 0 {
        return Err(format!("rule `{rule}` has an unclosed `(`"));
    }
    if out.is_empty() {
        return Ok("\"\"".into());
    }
    Ok(out.join(" "))
}

fn lex(src: &str) -> Result<Vec<(Tok, usize)>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ':' if chars[i..].starts_with(&[':', ':', '=']) => {
                toks.push((Tok::Define, line));
                i += 3;
            }
            '"' => {
                let (s, n) = string(&chars[i + 1..], line)?;
                toks.push((Tok::Str(s), line));
                i += n + 1;
            }
            '[' => {
                let (rx, n) = class(&chars[i + 1..], line)?;
                toks.push((Tok::Class(rx), line));
                i += n + 1;
            }
            '.' => {
                toks.push((Tok::Class("(?s:.)".into()), line));
                i += 1;
            }
            '(' | ')' | '|' => {
                let t = match c {
                    '(' => Tok::Open,
                    ')' => Tok::Close,
                    _ => Tok::Bar,
                };
                toks.push((t, line));
                i += 1;
            }
            '*' | '+' | '?' => {
                toks.push((Tok::Op(c), line));
                i += 1;
            }
            '{' => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or(format!("line {line}: `{{` without `}}`"))?;
                let inner: String = chars[i + 1..i + end].iter().collect();
                toks.push((Tok::Repeat(repeat(&inner, line)?), line));
                i += end + 1;
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let n = chars[i..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || **c == '-' || **c == '_')
                    .count();
                toks.push((Tok::Name(chars[i..i + n].iter().collect()), line));
                i += n;
            }
            c => return Err(format!("line {line}: unexpected `{c}`")),
        }
    }
    Ok(toks)
}

/// `m`, `m,`, `,n` or `m,n` checked, as Lark's `{...}`.
fn repeat(inner: &str, line: usize) -> Result<String, String> {
    let bad = || format!("line {line}: `{{{inner}}}` is not a repetition such as {{2}} or {{1,3}}");
    let num = |s: &str| -> Result<Option<u32>, String> {
        match s.trim() {
            "" => Ok(None),
            t => t.parse().map(Some).map_err(|_| bad()),
        }
    };
    let (lo, hi) = match inner.split_once(',') {
        Some((a, b)) => (num(a)?, num(b)?),
        None => {
            let n = num(inner)?.ok_or_else(bad)?;
            (Some(n), Some(n))
        }
    };
    if hi == Some(0) || lo.zip(hi).is_some_and(|(a, b)| a > b) {
        return Err(bad());
    }
    Ok(match (lo, hi) {
        (Some(a), Some(b)) if a == b => format!("{{{a}}}"),
        (a, b) => format!(
            "{{{},{}}}",
            a.map(|v| v.to_string()).unwrap_or_default(),
            b.map(|v| v.to_string()).unwrap_or_default()
        ),
    })
}

/// One character of a literal or class, after a backslash or not: the character and how many
/// source characters it took.
fn char_at(s: &[char], line: usize) -> Result<(char, usize), String> {
    let Some(&c) = s.first() else {
        return Err(format!("line {line}: the grammar ends inside a literal"));
    };
    if c != '\\' {
        return Ok((c, 1));
    }
    let Some(&e) = s.get(1) else {
        return Err(format!("line {line}: the grammar ends inside an escape"));
    };
    let hex = |n: usize| -> Result<(char, usize), String> {
        let digits: String = s.iter().skip(2).take(n).collect();
        u32::from_str_radix(&digits, 16)
            .ok()
            .filter(|_| digits.len() == n)
            .and_then(char::from_u32)
            .map(|c| (c, 2 + n))
            .ok_or(format!("line {line}: bad escape `\\{e}{digits}`"))
    };
    match e {
        'x' => hex(2),
        'u' => hex(4),
        'U' => hex(8),
        'n' => Ok(('\n', 2)),
        'r' => Ok(('\r', 2)),
        't' => Ok(('\t', 2)),
        '\\' | '"' | '[' | ']' | '-' | '^' => Ok((e, 2)),
        _ => Err(format!("line {line}: unknown escape `\\{e}`")),
    }
}

/// A `"..."` literal's text (after the opening quote) and how many characters it took.
fn string(s: &[char], line: usize) -> Result<(String, usize), String> {
    let mut out = String::new();
    let mut i = 0;
    loop {
        match s.get(i) {
            None | Some('\n') => return Err(format!("line {line}: unterminated string")),
            Some('"') => return Ok((out, i + 1)),
            _ => {
                let (c, n) = char_at(&s[i..], line)?;
                out.push(c);
                i += n;
            }
        }
    }
}

/// A `[...]` class (after the opening bracket) as a regex, and how many characters it took.
fn class(s: &[char], line: usize) -> Result<(String, usize), String> {
    let mut rx = String::from("[");
    let mut i = 0;
    if s.first() == Some(&'^') {
        rx.push('^');
        i = 1;
    }
    let mut any = false;
    loop {
        match s.get(i) {
            None | Some('\n') => return Err(format!("line {line}: unterminated `[`")),
            Some(']') if any => break,
            _ => {}
        }
        let (lo, n) = char_at(&s[i..], line)?;
        i += n;
        rx += &class_char(lo);
        if s.get(i) == Some(&'-') && s.get(i + 1).is_some_and(|&c| c != ']') {
            let (hi, n) = char_at(&s[i + 1..], line)?;
            if hi < lo {
                return Err(format!("line {line}: range `{lo}-{hi}` runs backwards"));
            }
            rx.push('-');
            rx += &class_char(hi);
            i += 1 + n;
        }
        any = true;
    }
    rx.push(']');
    Ok((rx, i + 1))
}

/// A character inside a regex class: letters and digits as they are, the rest by code point.
fn class_char(c: char) -> String {
    match c.is_ascii_alphanumeric() {
        true => c.to_string(),
        false => format!("\\x{{{:x}}}", c as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_the_usual_constructs() {
        let g = r#"
# a comment
root ::= item ("," ws item){0,3} list-end
item ::= [a-zA-Z_] [^"\\\x00-\x1F]* | "\"quoted\"\n" | .
ws ::= " "?
list-end ::=
  ( "!" | "?" )+
"#;
        let lark = gbnf_to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: g_root\n\
             g_root: g_item ( \",\" g_ws g_item ) {0,3} g_list_end\n\
             g_item: /[a-zA-Z\\x{5f}]/ /[^\\x{22}\\x{5c}\\x{0}-\\x{1f}]/ * | \"\\\"quoted\\\"\\n\" | /(?s:.)/\n\
             g_ws: \" \" ?\n\
             g_list_end: ( \"!\" | \"?\" ) +\n"
        );
    }

    #[test]
    fn names_what_is_wrong() {
        for (g, want) in [
            ("item ::= \"a\"", "no `root`"),
            ("root ::= other", "`other` is used but not defined"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root ::= (\"a\"", "unclosed"),
            ("root ::= \"a\n\"", "line 1: unterminated string"),
            ("root ::= [b-a]", "runs backwards"),
            ("root ::= * \"a\"", "follows nothing"),
            ("root ::= \"a\"{0}", "not a repetition"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root = \"a\"", "unexpected `=`"),
        ] {
            let e = gbnf_to_lark(g).unwrap_err();
            assert!(e.contains(want), "{g:?}: {e}");
        }
    }
}
