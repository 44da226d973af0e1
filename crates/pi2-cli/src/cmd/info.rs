//! `pi2 info`: what a model file is and what running it needs (`pi2_runtime::info`).

use super::model_path;
use crate::args::ModelArgs;
use anyhow::{Context, Result};
use clap::Args;
use pi2_model::Model;
use pi2_runtime::info::ModelInfo;

#[derive(Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: InfoArgs) -> Result<()> {
    let path = model_path(&a.model)?;
    let m = Model::load(&path).with_context(|| format!("cannot load model {}", path.display()))?;
    let info = ModelInfo::new(&m, &path, a.model.ctx_size);
    match a.json {
        true => println!("{}", serde_json::to_string_pretty(&info.json())?),
        false => println!("{info}"),
    }
    Ok(())
}
