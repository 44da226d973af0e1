//! Tokenizers built from GGUF vocabularies, following llama.cpp's behaviour:
//! - `gpt2`: byte-level BPE with merge ranks and a pre-tokenizer chosen by `tokenizer.ggml.pre`;
//! - `llama`: SentencePiece-style BPE by token score, `▁` for spaces and `<0xXX>` byte fallback.
//!
//! Special (control) tokens are cut out of the text first when `parse_special` is set; user-defined
//! tokens always are, as in llama.cpp.

use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};
use crate::specials::Specials;
use crate::vocab::Vocab;
use fancy_regex::Regex;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

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
    /// Byte-level BPE: (left id, right id) -> (rank, merged id); pre-tokenizer regexes in order.
    Bpe {
        merges: HashMap<(TokenId, TokenId), (u32, TokenId)>,
        pre: Vec<Regex>,
        /// A pre-tokenized piece that is itself a token is that token, merges or not (Llama 3's
        /// rule, as llama.cpp applies it for its pre-tokenizer family).
        ignore_merges: bool,
    },
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

const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]*[\p{L}&&[^A-Z]]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]+[\p{L}&&[^A-Z]]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian and other cased scripts
/// by explicit ranges (from its tokenizer.json, as llama.cpp runs it).
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+";

/// The pre-tokenizer regexes for a `tokenizer.ggml.pre` name (llama.cpp's table).
fn pre_tokenizer(name: &str) -> Result<Vec<&'static str>> {
    Ok(match name {
        "default" | "gpt-2" | "gpt2" => vec![GPT2_RE],
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            vec![r"\p{N}", GPT2_RE]
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => vec![LLAMA3_RE],
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" => vec![QWEN2_RE],
        // gpt-oss, Llama 4: llama.cpp's form of o200k's expression, where a "capital" is any
        // letter but a-z and a "small" one any letter but A-Z (other scripts count as both).
        "gpt-4o" | "llama4" => vec![GPT4O_RE],
        // Qwen 3.5: combining marks join letters.
        "qwen35" => vec![
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        // GPT-2's own expression, run as written (llama.cpp's `default` adds nothing to it).
        "mpt" | "olmo" | "jais" => vec![GPT2_RE],
        "falcon" => vec![
            r"[\p{P}\$\+<=>\^~\|`]+",
            GPT2_RE,
            "[0-9][0-9][0-9]",
        ],
        "deepseek-coder" => vec![
            "[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
            r"\p{N}",
        ],
        "deepseek-llm" => vec![
            "[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
            r"\s+$",
            "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
            r"\p{N}+",
        ],
        other => {
            return Err(ModelError::Tokenizer(format!(
                "unsupported pre-tokenizer `{other}` (supported: default, gpt2, smollm, starcoder, refact, command-r, llama-bpe, qwen2, qwen35, deepseek-r1-qwen, deepseek-llm, deepseek-coder, falcon, mpt, gpt-4o, llama4)"
            )))
        }
    })
}

/// The tokens that end generation: EOS, EOT and EOM, the control tokens llama.cpp treats as
/// such when present, and the FIM padding and separators.
fn end_of_generation(
    given: [Option<TokenId>; 3],
    tokens: &[&str],
    types: &[TokenType],
    fim: &crate::fim::Fim,
) -> Vec<TokenId> {
    let mut eog: Vec<TokenId> = given.into_iter().flatten().collect();
    for (i, t) in tokens.iter().enumerate() {
        let named = matches!(
            *t,
            "<|eot_id|>" | "<|im_end|>" | "<|end|>" | "<end_of_turn>" | "<|endoftext|>" | "<EOT>" | "<|end_of_text|>" | "<end_of_utterance>" | "<|return|>" | "<|call|>"
                // fill-in-the-middle repo/file separators end generation in llama.cpp too
                | "<|repo_name|>" | "<reponame>" | "<|file_sep|>"
        );
        if named
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
        let types: Vec<TokenType> =
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
            "gpt2" => {
                let pre_name = f
                    .get("tokenizer.ggml.pre")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                let pre = pre_tokenizer(pre_name)?
                    .into_iter()
                    .map(|re| {
                        Regex::new(re)
                            .map_err(|e| ModelError::Tokenizer(format!("pre-tokenizer regex: {e}")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let merge_list = string_array(f, "tokenizer.ggml.merges")?;
                let mut merges = HashMap::with_capacity(merge_list.len());
                for (rank, m) in merge_list.iter().enumerate() {
                    let Some((a, b)) = m.split_once(' ') else {
                        return Err(ModelError::Tokenizer(format!(
                            "merge #{rank} `{m}` has no space"
                        )));
                    };
                    let (Some(ia), Some(ib), Some(im)) =
                        (vocab.id(a), vocab.id(b), vocab.id(&format!("{a}{b}")))
                    else {
                        continue; // a merge whose parts or result are not tokens can never apply
                    };
                    merges.entry((ia, ib)).or_insert((rank as u32, im));
                }
                let ignore_merges = matches!(
                    pre_name,
                    "llama3"
                        | "llama-v3"
                        | "llama-bpe"
                        | "falcon3"
                        | "falcon-h1"
                        | "pixtral"
                        | "midm-2.0"
                        | "lfm2"
                );
                Kind::Bpe {
                    merges,
                    pre,
                    ignore_merges,
                }
            }
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
                    "unsupported tokenizer model `{other}` (supported: gpt2, llama)"
                )))
            }
        };
        let is_spm = matches!(kind, Kind::Spm { .. });
        let bos = opt_id(f, "tokenizer.ggml.bos_token_id", n)?;
        let eos = opt_id(f, "tokenizer.ggml.eos_token_id", n)?;
        let eot = opt_id(f, "tokenizer.ggml.eot_token_id", n)?;
        let eom = opt_id(f, "tokenizer.ggml.eom_token_id", n)?;
        let fim = crate::fim::Fim::find(f, &tokens);
        let eog = end_of_generation([eos, eot, eom], &tokens, &types, &fim);
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
                        Kind::Bpe {
                            merges,
                            pre,
                            ignore_merges,
                        } => self.encode_bpe(s, merges, pre, *ignore_merges, &mut ids),
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

    fn encode_bpe(
        &self,
        text: &str,
        merges: &HashMap<(TokenId, TokenId), (u32, TokenId)>,
        pre: &[Regex],
        ignore_merges: bool,
        out: &mut Vec<TokenId>,
    ) {
        let b2c = byte_to_char();
        let mut pieces = vec![text];
        for re in pre {
            pieces = pieces
                .into_iter()
                .flat_map(|p| split_keep_gaps(re, p))
                .collect();
        }
        let mut word = String::new();
        for piece in pieces {
            word.clear();
            word.extend(piece.bytes().map(|b| b2c[b as usize]));
            if ignore_merges {
                if let Some(id) = self.vocab.id(&word) {
                    out.push(id);
                    continue;
                }
            }
            let mut syms: Vec<TokenId> = Vec::with_capacity(word.len());
            for ch in word.chars() {
                let mut buf = [0u8; 4];
                match self.vocab.id(ch.encode_utf8(&mut buf)) {
                    Some(id) => syms.push(id),
                    None => continue, // every byte char is in a byte-level vocabulary; skip if not
                }
            }
            bpe_merge(&mut syms, |a, b| {
                merges.get(&(a, b)).map(|&(r, m)| (r as f32, m))
            });
            out.extend_from_slice(&syms);
        }
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
            Kind::Bpe { .. } => {
                let b2c = byte_to_char();
                text.chars()
                    .flat_map(|ch| match b2c.iter().position(|&c| c == ch) {
                        Some(b) => vec![b as u8],
                        None => ch.to_string().into_bytes(),
                    })
                    .collect()
            }
            Kind::Spm { .. } => {
                if self.types[id as usize] == TokenType::Byte {
                    if let Some(hex) = text.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                        if let Ok(b) = u8::from_str_radix(hex, 16) {
                            return vec![b];
                        }
                    }
                }
                text.replace('\u{2581}', " ").into_bytes()
            }
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

/// Regex split that also returns the text between matches (llama.cpp keeps unmatched runs).
fn split_keep_gaps<'t>(re: &Regex, text: &'t str) -> Vec<&'t str> {
    let mut out = Vec::new();
    let mut last = 0;
    for m in re.find_iter(text) {
        let Ok(m) = m else { break };
        if m.start() > last {
            out.push(&text[last..m.start()]);
        }
        if m.end() > m.start() {
            out.push(m.as_str());
        }
        last = m.end();
    }
    if last < text.len() {
        out.push(&text[last..]);
    }
    out
}

/// Greedy pairwise merging: repeatedly merge the adjacent pair with the lowest priority value
/// (leftmost on ties). `merge(a, b)` returns the pair's priority and merged id, if mergeable.
/// O(n log n) with a heap and stale-entry checks, so hostile long words stay cheap.
fn bpe_merge(
    syms: &mut Vec<TokenId>,
    mut merge: impl FnMut(TokenId, TokenId) -> Option<(f32, TokenId)>,
) {
    let n = syms.len();
    if n < 2 {
        return;
    }
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    let mut next: Vec<usize> = (1..=n).collect();
    let mut alive = vec![true; n];
    // (priority, left index, left id, right id)
    #[derive(PartialEq)]
    struct Cand(f32, usize, TokenId, TokenId);
    impl Eq for Cand {}
    impl PartialOrd for Cand {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Cand {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            // min-heap on (priority, left index)
            o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
        }
    }
    let mut heap = BinaryHeap::new();
    for i in 0..n - 1 {
        if let Some((p, _)) = merge(syms[i], syms[i + 1]) {
            heap.push(Cand(p, i, syms[i], syms[i + 1]));
        }
    }
    while let Some(Cand(_, l, a, b)) = heap.pop() {
        let r = next[l];
        if !alive[l] || r >= n || !alive[r] || syms[l] != a || syms[r] != b {
            continue; // stale
        }
        let Some((_, m)) = merge(a, b) else { continue };
        syms[l] = m;
        alive[r] = false;
        next[l] = next[r];
        if next[r] < n {
            prev[next[r]] = l;
        }
        let p = prev[l];
        if p < n {
            if let Some((pr, _)) = merge(syms[p], m) {
                heap.push(Cand(pr, p, syms[p], m));
            }
        }
        if next[l] < n {
            if let Some((pr, _)) = merge(m, syms[next[l]]) {
                heap.push(Cand(pr, l, m, syms[next[l]]));
            }
        }
    }
    let mut w = 0;
    for i in 0..n {
        if alive[i] {
            syms[w] = syms[i];
            w += 1;
        }
    }
    syms.truncate(w);
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

    #[test]
    fn merge_prefers_lowest_rank_then_leftmost() {
        // ids: a=0 b=1 ab=2 bb=3
        let mut s = vec![0, 1, 1];
        bpe_merge(&mut s, |x, y| match (x, y) {
            (0, 1) => Some((1.0, 2)),
            (1, 1) => Some((0.0, 3)),
            _ => None,
        });
        assert_eq!(s, vec![0, 3]);
        let mut s = vec![1, 1, 1, 1];
        bpe_merge(&mut s, |x, y| {
            if (x, y) == (1, 1) {
                Some((0.0, 3))
            } else {
                None
            }
        });
        assert_eq!(s, vec![3, 3]);
    }

    #[test]
    fn split_keeps_unmatched_text() {
        let re = Regex::new(r"\p{N}").unwrap();
        assert_eq!(
            split_keep_gaps(&re, "ab12 c3"),
            vec!["ab", "1", "2", " c", "3"]
        );
    }
}
