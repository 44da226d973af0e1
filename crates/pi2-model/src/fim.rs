//! Fill-in-the-middle tokens: the model's prefix, suffix and middle markers, and for
//! repository-level prompts its repository and file separators. Taken from the GGUF's
//! `tokenizer.ggml.fim_*_token_id` keys, else found by their text as llama.cpp finds them.

use crate::gguf::GgufFile;
use crate::TokenId;

/// A model's fill-in-the-middle tokens (`None` where it has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fim {
    pub pre: Option<TokenId>,
    pub suf: Option<TokenId>,
    pub mid: Option<TokenId>,
    pub pad: Option<TokenId>,
    pub rep: Option<TokenId>,
    pub sep: Option<TokenId>,
}

/// Per role: its GGUF key, and the texts llama.cpp recognises (Qwen, Granite, DeepSeek,
/// CodeLlama, StarCoder-style, GLM-4.5, Falcon-H1 coders).
const ROLES: [(&str, &[&str]); 6] = [
    (
        "fim_pre",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        "fim_suf",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        "fim_mid",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        "fim_pad",
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"],
    ),
    (
        "fim_rep",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    ("fim_sep", &["<|file_sep|>"]),
];

impl Fim {
    /// The FIM tokens of the vocabulary `tokens` in `f`.
    pub(crate) fn find(f: &GgufFile, tokens: &[&str]) -> Fim {
        let n = tokens.len();
        let ids: Vec<Option<TokenId>> = ROLES
            .iter()
            .map(|(key, texts)| {
                let given = f
                    .get(&format!("tokenizer.ggml.{key}_token_id"))
                    .and_then(|v| v.as_u64())
                    .filter(|&id| (id as usize) < n)
                    .map(|id| id as TokenId);
                given.or_else(|| {
                    texts
                        .iter()
                        .find_map(|t| tokens.iter().position(|v| v == t).map(|i| i as TokenId))
                })
            })
            .collect();
        Fim {
            pre: ids[0],
            suf: ids[1],
            mid: ids[2],
            pad: ids[3],
            rep: ids[4],
            sep: ids[5],
        }
    }

    /// The prefix, suffix and middle tokens, when the model has all three.
    pub fn markers(&self) -> Option<(TokenId, TokenId, TokenId)> {
        Some((self.pre?, self.suf?, self.mid?))
    }
}
