//! `pi2 embed`: each text's embedding (pooled final hidden states, L2-normalized) as JSON.

use crate::args::ModelArgs;
use anyhow::Result;
use clap::Args;
use pi2_runtime::embed::{embed, Pooling};

#[derive(Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// How token states become one vector: mean, cls (first token) or last
    #[arg(long, default_value = "mean")]
    pub pooling: Pooling,
    /// Texts to embed (one vector each)
    #[arg(required = true)]
    pub texts: Vec<String>,
    #[command(flatten)]
    pub session: super::sparse_args::SessionArgs,
}

pub fn run(a: EmbedArgs) -> Result<()> {
    let (path, opts) = super::session_model(&a.model, &a.session, "embed")?;
    let model = pi2_runtime::load_model(&path)?;
    let tok = &model.tokenizer;
    let inputs: Vec<_> = a.texts.iter().map(|t| tok.encode(t, true, false)).collect();
    let longest = inputs.iter().map(Vec::len).max().unwrap_or(1);
    let prepared = pi2_runtime::prepare(&model, &path, &opts)?;
    let (mut engine, n_batch) = prepared.engine_within_budget(longest.min(512))?;
    let mut out = Vec::new();
    for ids in &inputs {
        out.push(embed(&mut engine, ids, n_batch, a.pooling)?);
    }
    let v = serde_json::json!({
        "n_embd": model.config.n_embd,
        "pooling": format!("{:?}", a.pooling).to_lowercase(),
        "tokens": inputs.iter().map(Vec::len).collect::<Vec<_>>(),
        "embeddings": out,
    });
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}
