//! Tokenizers built from GGUF vocabularies, following llama.cpp's behaviour:
//! - `gpt2`: byte-level BPE with merge ranks and a pre-tokenizer chosen by `tokenizer.ggml.pre`;
//! - `gemma4`: BPE with merge ranks over raw UTF-8, `▁` for spaces and `<0xXX>` byte fallback;
//! - `llama`: SentencePiece-style BPE by token score, `▁` for spaces and `<0xXX>` byte fallback.
//!
//! Special (control) tokens are cut out of the text first when `parse_special` is set; user-defined
//! tokens always are, as in llama.cpp.

use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};
use crate::specials::Specials;
use crate::vocab::Vocab;
use std::cmp::Reverse;

mod bpe;
use bpe::{bpe_merge, Bpe};

pub type TokenId = u32;

/// GGUF `tokenizer.ggml.token_type` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_i64(v: i64) -> TokenType {
        match v {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }
}

#[derive(Debug)]
enum Kind {
    /// BPE by merge rank.
    Bpe(Bpe),
    /// SentencePiece-style BPE by score.
    Spm {
        scores: Vec<f32>,
        add_space_prefix: bool,
        byte_tokens: Vec<Option<TokenId>>,
    },
}

/// A tokenizer for one model's vocabulary.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    types: Vec<TokenType>,
    kind: Kind,
    /// Control and user-defined tokens, longest text first (the partition order).
    specials: Specials,
    pub bos: Option<TokenId>,
    pub eos: Option<TokenId>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// End-of-generation tokens (EOS, EOT, and control tokens llama.cpp treats as such).
    pub eog: Vec<TokenId>,
    /// Fill-in-the-middle tokens.
    pub fim: crate::fim::Fim,
}

/// Control tokens that end generation wherever a vocabulary has them (llama.cpp's list).
const END_TOKENS: [&str; 25] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
    // fill-in-the-middle repo/file separators end generation in llama.cpp too
    "<|repo_name|>",
    "<reponame>",
    "<|file_sep|>",
];

/// Harmony's (gpt-oss) header tokens: the answer's channels are parsed from their text, so
/// they are always shown, as llama.cpp makes them user-defined in any vocabulary.
const SHOWN_HEADER_TOKENS: [&str; 4] = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// The tokens that end generation: EOS, EOT and EOM, the control tokens llama.cpp treats as
/// such when present, and the FIM padding and separators. Adjusts `types` as llama.cpp does:
/// in a harmony vocabulary (`<|return|>` and `<|call|>`, or `<|calls|>` and `<|flush|>`)
/// `<|end|>` only ends a message, not the answer, and is shown with the header tokens; where
/// `<|tool_response>` marks turns, `</s>` is an ordinary token.
fn end_of_generation(
    given: [Option<TokenId>; 3],
    tokens: &[&str],
    types: &mut [TokenType],
    fim: &crate::fim::Fim,
) -> Vec<TokenId> {
    let mut eog: Vec<TokenId> = given.into_iter().flatten().collect();
    for (i, t) in tokens.iter().enumerate() {
        if END_TOKENS.contains(t)
            && matches!(types[i], TokenType::Control | TokenType::UserDefined)
            && !eog.contains(&(i as TokenId))
        {
            eog.push(i as TokenId);
        }
    }
    for id in [fim.pad, fim.rep, fim.sep].into_iter().flatten() {
        if !eog.contains(&id) {
            eog.push(id);
        }
    }
    let ends = |eog: &[TokenId], name: &str| eog.iter().any(|&i| tokens[i as usize] == name);
    let harmony = (ends(&eog, "<|return|>") && ends(&eog, "<|call|>"))
        || (ends(&eog, "<|calls|>") && ends(&eog, "<|flush|>"));
    for (i, t) in tokens.iter().enumerate() {
        if SHOWN_HEADER_TOKENS.contains(t) || (harmony && *t == "<|end|>") {
            types[i] = TokenType::UserDefined;
        }
    }
    if harmony {
        eog.retain(|&i| tokens[i as usize] != "<|end|>");
    }
    if ends(&eog, "<|tool_response>") {
        if let Some(at) = eog.iter().position(|&i| tokens[i as usize] == "</s>") {
            types[eog[at] as usize] = TokenType::Normal;
            eog.remove(at);
        }
    }
    eog
}

/// GPT-2's reversible byte -> printable char map.
pub(crate) fn byte_to_char() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    map
}

/// The strings of a metadata array, borrowed (no copy per string).
fn string_array<'f>(f: &'f GgufFile, key: &str) -> Result<Vec<&'f str>> {
    let arr = f
        .get(key)
        .ok_or_else(|| ModelError::MissingKey(key.into()))?;
    arr.strings().ok_or(ModelError::WrongKeyType {
        key: key.into(),
        expected: "string array",
        got: arr.type_name(),
    })
}

fn opt_id(f: &GgufFile, key: &str, n: usize) -> Result<Option<TokenId>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(id) if (id as usize) < n => Ok(Some(id as TokenId)),
            // llama.cpp writes -1 (as u32 max) for "none"
            Some(id) if id == u32::MAX as u64 => Ok(None),
            _ => Err(ModelError::Tokenizer(format!(
                "{key} = {v:?} is not a token id below {n}"
            ))),
        },
    }
}

impl Tokenizer {
    /// Build from `tokenizer.ggml.*` metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let model = f
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::MissingKey("tokenizer.ggml.model".into()))?;
        let tokens = string_array(f, "tokenizer.ggml.tokens")?;
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::Tokenizer("empty vocabulary".into()));
        }
        let mut types: Vec<TokenType> =
            match f.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
                Some(a) if a.len() == n => a
                    .iter()
                    .map(|v| TokenType::from_i64(v.as_i64().unwrap_or(1)))
                    .collect(),
                Some(a) => {
                    return Err(ModelError::Tokenizer(format!(
                        "{} token types for {n} tokens",
                        a.len()
                    )))
                }
                None => vec![TokenType::Normal; n],
            };
        let vocab = Vocab::new(tokens.iter().copied())?;
        let flag = |k: &str, default: bool| f.get(k).and_then(Value::as_bool).unwrap_or(default);
        let kind = match model {
            "gpt2" | "gemma4" => Kind::Bpe(bpe::read(f, &vocab, model)?),
            "llama" => {
                let scores = match f.get("tokenizer.ggml.scores").and_then(Value::as_array) {
                    Some(a) if a.len() == n => {
                        a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect()
                    }
                    _ => {
                        return Err(ModelError::Tokenizer(
                            "`llama` vocabulary needs tokenizer.ggml.scores for every token".into(),
                        ))
                    }
                };
                let byte_tokens = (0..256)
                    .map(|b| vocab.id(&format!("<0x{b:02X}>")))
                    .collect();
                Kind::Spm {
                    scores,
                    add_space_prefix: flag("tokenizer.ggml.add_space_prefix", true),
                    byte_tokens,
                }
            }
            other => {
                return Err(ModelError::Tokenizer(format!(
                    "unsupported tokenizer model `{other}` (supported: gpt2, gemma4, llama)"
                )))
            }
        };
        let is_spm = matches!(kind, Kind::Spm { .. });
        let bos = opt_id(f, "tokenizer.ggml.bos_token_id", n)?;
        let eos = opt_id(f, "tokenizer.ggml.eos_token_id", n)?;
        let eot = opt_id(f, "tokenizer.ggml.eot_token_id", n)?;
        let eom = opt_id(f, "tokenizer.ggml.eom_token_id", n)?;
        let fim = crate::fim::Fim::find(f, &tokens);
        let eog = end_of_generation([eos, eot, eom], &tokens, &mut types, &fim);
        let mut specials: Vec<TokenId> = (0..n as TokenId)
            .filter(|&i| {
                matches!(
                    types[i as usize],
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                )
            })
            .filter(|&i| !tokens[i as usize].is_empty())
            .collect();
        specials.sort_by_key(|&i| Reverse(tokens[i as usize].len()));
        let specials = Specials::new(specials.iter().map(|&i| {
            let control = matches!(types[i as usize], TokenType::Control | TokenType::Unknown);
            (i, tokens[i as usize], control)
        }));
        Ok(Self {
            vocab,
            types,
            kind,
            specials,
            bos,
            eos,
            add_bos: flag("tokenizer.ggml.add_bos_token", is_spm),
            add_eos: flag("tokenizer.ggml.add_eos_token", false),
            eog,
            fim,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// Token ids as a caller gave them (any integers), checked against the vocabulary: the ids,
    /// or the position and value of the first one outside it.
    pub fn checked_ids(
        &self,
        ids: impl IntoIterator<Item = i64>,
    ) -> std::result::Result<Vec<TokenId>, (usize, i64)> {
        ids.into_iter()
            .enumerate()
            .map(|(i, t)| {
                u32::try_from(t)
                    .ok()
                    .filter(|&t| (t as usize) < self.vocab.len())
                    .ok_or((i, t))
            })
            .collect()
    }

    /// A token's kind (normal text, control, byte, ...), `None` outside the vocabulary.
    pub fn token_type(&self, id: TokenId) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// A token's text as stored in the vocabulary.
    pub fn token_text(&self, id: TokenId) -> Option<&str> {
        self.vocab.get(id)
    }

    /// Look a token up by its exact vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.vocab.id(text)
    }

    pub fn is_eog(&self, id: TokenId) -> bool {
        self.eog.contains(&id)
    }

    /// Split `text` into raw-text fragments and special token ids (user-defined tokens always,
    /// control tokens when `parse_special`).
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Result<TokenId, &'t str>> {
        self.specials.partition(text, parse_special)
    }

    /// Text -> token ids. `add_special` adds BOS/EOS as the model asks; `parse_special` turns
    /// control-token text (e.g. `<|im_start|>`) into its single id.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<TokenId> {
        self.encode_fragments(self.partition(text, parse_special), add_special)
    }

    /// Whether `text` holds the text of a control token (such as `<|im_end|>`).
    pub fn has_control_text(&self, text: &str) -> bool {
        self.partition(text, true) != self.partition(text, false)
    }

    /// Like [`Tokenizer::encode`] with control-token parsing, except inside the byte ranges
    /// `literal` (sorted, disjoint, on character boundaries), which are always text: a chat
    /// template's own markup becomes control tokens, the messages' words never do. Text runs
    /// on both sides of a range's edge are tokenized together, so a text without control-token
    /// text inside the ranges encodes exactly as `encode(text, add_special, true)`.
    pub fn encode_marked(
        &self,
        text: &str,
        add_special: bool,
        literal: &[std::ops::Range<usize>],
    ) -> Vec<TokenId> {
        let mut frags = Vec::new();
        let mut at = 0;
        for r in literal {
            self.push_fragments(text, at..r.start, true, &mut frags);
            self.push_fragments(text, r.clone(), false, &mut frags);
            at = r.end;
        }
        self.push_fragments(text, at..text.len(), true, &mut frags);
        self.encode_fragments(frags, add_special)
    }

    /// Appends the fragments of `text[range]`, joining a text run to the one before it when
    /// the two touch (they were one run in `text`).
    fn push_fragments<'t>(
        &self,
        text: &'t str,
        range: std::ops::Range<usize>,
        parse_special: bool,
        frags: &mut Vec<Result<TokenId, &'t str>>,
    ) {
        for f in self.partition(&text[range], parse_special) {
            match (frags.last_mut(), f) {
                (_, Err("")) => {}
                (Some(Err(prev)), Err(s)) if touches(text, prev, s) => {
                    let start = offset_in(text, prev);
                    *prev = &text[start..offset_in(text, s) + s.len()];
                }
                (_, f) => frags.push(f),
            }
        }
    }

    fn encode_fragments(
        &self,
        frags: Vec<Result<TokenId, &str>>,
        add_special: bool,
    ) -> Vec<TokenId> {
        let mut ids = Vec::new();
        if add_special && self.add_bos {
            ids.extend(self.bos);
        }
        let mut prev_special = true;
        for frag in frags {
            match frag {
                Ok(id) => {
                    ids.push(id);
                    prev_special = true;
                }
                // Empty text is no fragment (llama.cpp adds no space prefix for it either).
                Err("") => {}
                Err(s) => {
                    match &self.kind {
                        Kind::Bpe(bpe) => bpe.encode(&self.vocab, s, &mut ids),
                        Kind::Spm {
                            scores,
                            add_space_prefix,
                            byte_tokens,
                        } => {
                            let prefix = *add_space_prefix && prev_special;
                            self.encode_spm(s, prefix, scores, byte_tokens, &mut ids)
                        }
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            ids.extend(self.eos);
        }
        ids
    }

    fn encode_spm(
        &self,
        text: &str,
        space_prefix: bool,
        scores: &[f32],
        byte_tokens: &[Option<TokenId>],
        out: &mut Vec<TokenId>,
    ) {
        let mut s = String::with_capacity(text.len() + 3);
        if space_prefix {
            s.push('\u{2581}');
        }
        s.push_str(&text.replace(' ', "\u{2581}"));
        // Start from single characters; a character that is not a token becomes its byte tokens
        // (byte tokens never merge, so this equals llama.cpp's fallback after merging).
        let unk = self
            .types
            .iter()
            .position(|&t| t == TokenType::Unknown)
            .map(|i| i as TokenId);
        let mut syms: Vec<TokenId> = Vec::with_capacity(s.len());
        for ch in s.chars() {
            let mut buf = [0u8; 4];
            let c = ch.encode_utf8(&mut buf);
            match self.vocab.id(c) {
                Some(id) => syms.push(id),
                None => syms.extend(c.bytes().filter_map(|b| byte_tokens[b as usize].or(unk))),
            }
        }
        // Merge by highest score of the merged token (priority = -score).
        let mut merged_text = String::new();
        bpe_merge(&mut syms, |a, b| {
            merged_text.clear();
            merged_text.push_str(self.vocab.get(a).unwrap_or_default());
            merged_text.push_str(self.vocab.get(b).unwrap_or_default());
            self.vocab
                .id(&merged_text)
                .map(|m| (-scores[m as usize], m))
        });
        out.extend_from_slice(&syms);
    }

    /// The bytes a token stands for. Control tokens render as their text only when `special`.
    pub fn token_bytes(&self, id: TokenId, special: bool) -> Vec<u8> {
        let Some(text) = self.vocab.get(id) else {
            return Vec::new();
        };
        match self.types[id as usize] {
            TokenType::Control | TokenType::Unknown | TokenType::Unused => {
                return if special {
                    text.as_bytes().to_vec()
                } else {
                    Vec::new()
                };
            }
            TokenType::UserDefined => return text.as_bytes().to_vec(),
            _ => {}
        }
        match &self.kind {
            Kind::Bpe(bpe) => bpe.bytes(text, self.types[id as usize] == TokenType::Byte),
            Kind::Spm { .. } => bpe::spm_bytes(text, self.types[id as usize] == TokenType::Byte),
        }
    }

    /// Token ids -> bytes (may end inside a UTF-8 sequence when cut mid-stream).
    pub fn decode(&self, ids: &[TokenId], special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend(self.token_bytes(id, special));
        }
        if let Kind::Spm {
            add_space_prefix: true,
            ..
        } = self.kind
        {
            let first_normal = ids
                .iter()
                .find(|&&i| !matches!(self.types.get(i as usize), Some(TokenType::Control)));
            if first_normal.is_some() && out.first() == Some(&b' ') {
                out.remove(0);
            }
        }
        out
    }
}

/// Where `part`, a slice of `whole`, starts in it.
fn offset_in(whole: &str, part: &str) -> usize {
    part.as_ptr() as usize - whole.as_ptr() as usize
}

/// Whether slice `b` of `whole` starts where slice `a` ends.
fn touches(whole: &str, a: &str, b: &str) -> bool {
    offset_in(whole, a) + a.len() == offset_in(whole, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let m = byte_to_char();
        let mut seen = std::collections::HashSet::new();
        for c in m {
            assert!(seen.insert(c));
        }
        assert_eq!(m[b'A' as usize], 'A');
        assert_eq!(m[b' ' as usize], '\u{120}');
        assert_eq!(m[b'\n' as usize], '\u{10A}');
    }
}
