//! The calibration text built into pi2, so that a conversion's quality holds beyond one genre:
//! archaic English prose (the King James Bible, public domain), Python source (modules of the
//! Python standard library, PSF License) and chat turns (the ChatterBot English corpus,
//! BSD-3-Clause) rendered through the model's own chat template. Sources and licences are in
//! `calibration/README.md` beside this crate.
//!
//! The genres are interleaved in segments of [`SEGMENT`] tokens, so every prefix a profile or
//! a conversion uses holds all three in equal parts.

use crate::ConvertError;
use pi2_model::{Message, Model, TokenId};

const PROSE: &str = include_str!("../calibration/prose.txt");
const CODE: &str = include_str!("../calibration/code.py.txt");
const CHAT: &str = include_str!("../calibration/chat.jsonl");

/// Tokens per segment of one genre.
pub const SEGMENT: usize = 256;

/// The built-in calibration's source code (Python's standard library, PSF licence): also a
/// realistic text for editing workloads.
pub fn builtin_code() -> &'static str {
    CODE
}

/// Chat question-and-answer pairs rendered per conversation.
const PAIRS_PER_CHAT: usize = 24;

/// Up to `n` calibration tokens of `file` (its start), or of the built-in text when `None`;
/// and the text's name for messages.
pub fn tokens(
    model: &Model,
    file: Option<&std::path::Path>,
    n: usize,
) -> Result<(Vec<TokenId>, String), ConvertError> {
    let Some(f) = file else {
        let toks = builtin_tokens(model, n)?;
        return Ok((toks, "the built-in calibration text".into()));
    };
    let text = std::fs::read_to_string(f).map_err(|source| ConvertError::Io {
        path: f.display().to_string(),
        source,
    })?;
    let mut toks = model.tokenizer.encode(&text, false, false);
    toks.truncate(n);
    let name = f
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok((toks, name))
}

/// The built-in calibration text as `model`'s tokens: up to `n` tokens (all there are if fewer),
/// the genres taking turns every [`SEGMENT`] tokens.
pub fn builtin_tokens(model: &Model, n: usize) -> Result<Vec<TokenId>, ConvertError> {
    let tok = &model.tokenizer;
    let prose = tok.encode(PROSE, false, false);
    let code = tok.encode(CODE, false, false);
    let chat = chat_tokens(model)?;
    let mut out = Vec::with_capacity(n);
    let genres = [&prose, &code, &chat];
    let mut at = [0usize; 3];
    'fill: loop {
        let before = out.len();
        for (g, toks) in genres.iter().enumerate() {
            let end = (at[g] + SEGMENT).min(toks.len());
            for &t in &toks[at[g]..end] {
                if out.len() == n {
                    break 'fill;
                }
                out.push(t);
            }
            at[g] = end;
        }
        if out.len() == before {
            break;
        }
    }
    Ok(out)
}

/// The chat corpus as conversations of alternating user and assistant turns, rendered by the
/// model's chat template (its markup becoming the model's special tokens) and tokenized.
fn chat_tokens(model: &Model) -> Result<Vec<TokenId>, ConvertError> {
    let template = model.chat_template()?;
    let pairs: Vec<Vec<String>> = CHAT
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).map_err(|e| {
                ConvertError::Refused(format!("the built-in chat calibration text: {e}"))
            })
        })
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for group in pairs.chunks(PAIRS_PER_CHAT) {
        let messages: Vec<Message> = group
            .iter()
            .flat_map(|turns| {
                turns
                    .iter()
                    .enumerate()
                    .map(|(i, t)| Message::new(if i % 2 == 0 { "user" } else { "assistant" }, t))
            })
            .collect();
        let text = template.render(&messages, false)?;
        out.extend(model.tokenizer.encode(&text, false, true));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_texts_are_there_and_the_chats_parse() {
        assert!(super::PROSE.len() > 40_000 && super::CODE.len() > 40_000);
        let n = super::CHAT
            .lines()
            .map(|l| serde_json::from_str::<Vec<String>>(l).unwrap().len())
            .filter(|&t| t >= 2)
            .count();
        assert!(n > 200, "{n} conversations");
    }
}
