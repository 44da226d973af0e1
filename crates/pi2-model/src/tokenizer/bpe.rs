//! Byte-pair encoding by merge rank: llama.cpp's pre-tokenizer table, the two ways vocabularies
//! spell text, and the merge loop.

use super::{byte_to_char, string_array, TokenId};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, Value};
use crate::vocab::Vocab;
use fancy_regex::Regex;
use std::collections::{BinaryHeap, HashMap};

const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]*[\p{L}&&[^A-Z]]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}&&[^a-z]]+[\p{L}&&[^A-Z]]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian and other cased scripts
/// by explicit ranges (from its tokenizer.json, as llama.cpp runs it).
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+";

/// The pre-tokenizer regexes for a `tokenizer.ggml.pre` name (llama.cpp's table).
pub(super) fn pre_tokenizer(name: &str) -> Result<Vec<&'static str>> {
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
        // Gemma 4: whole lines (merges run over the text as SentencePiece does), newline runs.
        "gemma4" => vec![r"[^\n]+|[\n]+"],
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
                "unsupported pre-tokenizer `{other}` (supported: default, gpt2, smollm, starcoder, refact, command-r, llama-bpe, qwen2, qwen35, deepseek-r1-qwen, deepseek-llm, deepseek-coder, falcon, mpt, gpt-4o, llama4, gemma4)"
            )))
        }
    })
}

/// How a BPE vocabulary spells text.
#[derive(Debug)]
pub(super) enum BpeText {
    /// GPT-2's byte-level form: every byte is a printable character of its own.
    ByteLevel,
    /// Raw UTF-8 with spaces as `▁`; a character outside the vocabulary becomes its `<0xXX>`
    /// byte tokens (Gemma 4, llama.cpp's `escape_whitespaces` without byte encoding).
    Escaped { byte_tokens: Vec<Option<TokenId>> },
}

/// A BPE vocabulary's rules: (left id, right id) -> (rank, merged id), the pre-tokenizer's
/// regexes in order, and how text is spelled.
#[derive(Debug)]
pub(super) struct Bpe {
    merges: HashMap<(TokenId, TokenId), (u32, TokenId)>,
    pre: Vec<Regex>,
    /// A pre-tokenized piece that is itself a token is that token, merges or not (Llama 3's
    /// rule, as llama.cpp applies it for its pre-tokenizer family).
    ignore_merges: bool,
    text: BpeText,
}

/// The BPE rules of a `gpt2` or `gemma4` vocabulary.
pub(super) fn read(f: &GgufFile, vocab: &Vocab, model: &str) -> Result<Bpe> {
    let escaped = model == "gemma4";
    // llama.cpp fixes Gemma 4's pre-tokenizer whatever the file says.
    let pre_name = match escaped {
        true => "gemma4",
        false => f
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .unwrap_or("default"),
    };
    let pre = pre_tokenizer(pre_name)?
        .into_iter()
        .map(|re| {
            Regex::new(re).map_err(|e| ModelError::Tokenizer(format!("pre-tokenizer regex: {e}")))
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
    let text = match escaped {
        true => BpeText::Escaped {
            byte_tokens: (0..256)
                .map(|b| vocab.id(&format!("<0x{b:02X}>")))
                .collect(),
        },
        false => BpeText::ByteLevel,
    };
    Ok(Bpe {
        merges,
        pre,
        ignore_merges,
        text,
    })
}

impl Bpe {
    /// Append the tokens of `text` (no special tokens in it) to `out`.
    pub(super) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<TokenId>) {
        let escaped;
        let text = match self.text {
            BpeText::ByteLevel => text,
            BpeText::Escaped { .. } => {
                escaped = text.replace(' ', "\u{2581}");
                escaped.as_str()
            }
        };
        let mut pieces = vec![text];
        for re in &self.pre {
            pieces = pieces
                .into_iter()
                .flat_map(|p| split_keep_gaps(re, p))
                .collect();
        }
        let b2c = byte_to_char();
        let mut word = String::new();
        for piece in pieces {
            let word = match self.text {
                BpeText::ByteLevel => {
                    word.clear();
                    word.extend(piece.bytes().map(|b| b2c[b as usize]));
                    word.as_str()
                }
                BpeText::Escaped { .. } => piece,
            };
            // llama.cpp's rule for Gemma 4: a run of newlines that is a token is that token.
            let whole = self.ignore_merges
                || matches!(self.text, BpeText::Escaped { .. }) && word.bytes().all(|b| b == b'\n');
            if whole {
                if let Some(id) = vocab.id(word) {
                    out.push(id);
                    continue;
                }
            }
            self.encode_word(vocab, word, out);
        }
    }

    /// One pre-tokenized piece: characters merged by rank. A character outside the vocabulary
    /// never merges (every merge's parts are tokens), so the runs on either side merge apart
    /// and it becomes its byte tokens (or nothing, in a byte-level vocabulary that lacks it).
    fn encode_word(&self, vocab: &Vocab, word: &str, out: &mut Vec<TokenId>) {
        let mut run: Vec<TokenId> = Vec::with_capacity(word.len());
        let merge = |run: &mut Vec<TokenId>, out: &mut Vec<TokenId>| {
            bpe_merge(run, |a, b| {
                self.merges.get(&(a, b)).map(|&(r, m)| (r as f32, m))
            });
            out.append(run);
        };
        for ch in word.chars() {
            let mut buf = [0u8; 4];
            let c = ch.encode_utf8(&mut buf);
            match vocab.id(c) {
                Some(id) => run.push(id),
                None => {
                    merge(&mut run, out);
                    if let BpeText::Escaped { byte_tokens } = &self.text {
                        out.extend(c.bytes().filter_map(|b| byte_tokens[b as usize]));
                    }
                }
            }
        }
        merge(&mut run, out);
    }

    /// The bytes a normal or byte token's `text` stands for.
    pub(super) fn bytes(&self, text: &str, is_byte: bool) -> Vec<u8> {
        match self.text {
            BpeText::ByteLevel => {
                let b2c = byte_to_char();
                text.chars()
                    .flat_map(|ch| match b2c.iter().position(|&c| c == ch) {
                        Some(b) => vec![b as u8],
                        None => ch.to_string().into_bytes(),
                    })
                    .collect()
            }
            BpeText::Escaped { .. } => spm_bytes(text, is_byte),
        }
    }
}

/// The bytes of a SentencePiece-spelled token: `<0xXX>` for a byte token, `▁` as a space.
pub(super) fn spm_bytes(text: &str, is_byte: bool) -> Vec<u8> {
    if is_byte {
        if let Some(hex) = text.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                return vec![b];
            }
        }
    }
    text.replace('\u{2581}', " ").into_bytes()
}

/// Regex split that also returns the text between matches (llama.cpp keeps unmatched runs).
pub(super) fn split_keep_gaps<'t>(re: &Regex, text: &'t str) -> Vec<&'t str> {
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
pub(super) fn bpe_merge(
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

#[cfg(test)]
mod tests {
    use super::*;

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
