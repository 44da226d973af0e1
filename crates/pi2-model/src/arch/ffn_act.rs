//! The gated FFN's nonlinearities and the names files give them.

/// The gated FFN's nonlinearity: neuron i contributes `gate_act(g_i) * up_act(u_i)` times its
/// down column, where `g_i` and `u_i` are its gate and up rows dotted with the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// SwiGLU: `silu(g) * u` (Llama, Mistral, SmolLM2, Mixtral).
    Silu,
    /// ReGLU: `relu(g) * u` (ReluLLaMA, ProSparse, Bamboo).
    Relu,
    /// dReLU: `relu(g) * relu(u)` (TurboSparse).
    DRelu,
    /// GeGLU: `gelu(g) * u` with GELU's tanh approximation (Gemma).
    Gelu,
    /// gpt-oss's SwiGLU: `g * sigmoid(1.702 g) * (u + 1)` with `g` clamped at 7 and `u` to
    /// [-7, 7].
    SwigluOai,
}

/// gpt-oss's gate clamp and sigmoid slope (llama.cpp's `ggml_swiglu_oai`).
const OAI_LIMIT: f32 = 7.0;
const OAI_ALPHA: f32 = 1.702;

/// Metadata key naming the FFN nonlinearity (`silu` when absent). GGUF has no standard key for
/// it: llama.cpp ignores this one and runs such files as SwiGLU, which costs it the same time.
pub const KEY_FFN_ACTIVATION: &str = "pi2.ffn_activation";

impl FfnAct {
    /// The name written to [`KEY_FFN_ACTIVATION`].
    pub fn name(self) -> &'static str {
        match self {
            FfnAct::Silu => "silu",
            FfnAct::Relu => "reglu",
            FfnAct::DRelu => "drelu",
            FfnAct::Gelu => "geglu",
            FfnAct::SwigluOai => "swiglu_oai",
        }
    }

    /// Accepts the written names and their common aliases.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "silu" | "swiglu" => Some(FfnAct::Silu),
            "relu" | "reglu" => Some(FfnAct::Relu),
            "drelu" | "dreglu" => Some(FfnAct::DRelu),
            "gelu" | "geglu" => Some(FfnAct::Gelu),
            "swiglu_oai" => Some(FfnAct::SwigluOai),
            _ => None,
        }
    }

    #[inline]
    pub fn gate(self, g: f32) -> f32 {
        match self {
            FfnAct::Silu => g / (1.0 + (-g).exp()),
            FfnAct::Relu | FfnAct::DRelu => g.max(0.0),
            FfnAct::Gelu => 0.5 * g * (1.0 + (0.797_884_6 * (g + 0.044_715 * g * g * g)).tanh()),
            FfnAct::SwigluOai => {
                let g = g.min(OAI_LIMIT);
                g / (1.0 + (-OAI_ALPHA * g).exp())
            }
        }
    }

    #[inline]
    pub fn up(self, u: f32) -> f32 {
        match self {
            FfnAct::DRelu => u.max(0.0),
            FfnAct::SwigluOai => u.clamp(-OAI_LIMIT, OAI_LIMIT) + 1.0,
            FfnAct::Silu | FfnAct::Relu | FfnAct::Gelu => u,
        }
    }

    /// Whether an inactive neuron contributes exactly zero (ReLU family), so skipping it loses
    /// nothing.
    pub fn exact_sparsity(self) -> bool {
        matches!(self, FfnAct::Relu | FfnAct::DRelu)
    }
}
