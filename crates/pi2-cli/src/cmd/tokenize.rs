//! `pi2 tokenize`: token ids of a text, as a JSON array.

use super::load_model;
use crate::args::ModelArgs;
use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Treat control-token text such as <|im_start|> as plain text
    #[arg(long)]
    pub no_parse_special: bool,
    /// Add BOS/EOS as the model asks
    #[arg(long)]
    pub add_special: bool,
    /// Print each id with its piece
    #[arg(long)]
    pub pieces: bool,
    /// Text to tokenize
    pub text: String,
}

pub fn run(a: TokenizeArgs) -> Result<()> {
    let model = load_model(&a.model)?;
    let tok = &model.tokenizer;
    let ids = tok.encode(&a.text, a.add_special, !a.no_parse_special);
    if a.pieces {
        let rows: Vec<_> = ids
            .iter()
            .map(|&id| serde_json::json!({"id": id, "piece": String::from_utf8_lossy(&tok.token_bytes(id, true))}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("{}", serde_json::to_string(&ids)?);
    }
    Ok(())
}
