//! `pi2 chat`'s settings that change mid-chat (ollama's `/set`): sampling options by their
//! command-line names, and whether each reply's speed is shown.

use crate::args::SampleArgs;
use anyhow::{bail, Context, Result};

/// What `/set` changes and `/show` prints.
pub(super) struct Settings {
    pub sample: SampleArgs,
    /// Print each reply's tokens and speed after it.
    pub verbose: bool,
    /// The last reply's tokens and seconds.
    pub last: Option<(usize, f64)>,
}

pub(super) const SET_HELP: &str =
    "  /set NAME VALUE  change a sampling option for the next replies: temp, top-k, top-p, min-p,
                   repeat-penalty, repeat-last-n, presence-penalty, frequency-penalty, seed;
                   /set verbose on|off shows each reply's speed
  /show            the sampling options and the last reply's speed";

impl Settings {
    /// Applies `/set NAME VALUE`; says what changed.
    pub fn set(&mut self, arg: &str) -> Result<String> {
        let (name, value) = arg
            .split_once(char::is_whitespace)
            .map(|(n, v)| (n, v.trim()))
            .context("/set needs a name and a value (e.g. /set temp 0.2)")?;
        let name = name.trim_start_matches("--").replace('_', "-");
        let s = &mut self.sample;
        let float = || -> Result<f32> {
            let v: f32 = value
                .parse()
                .with_context(|| format!("{name}: `{value}` is not a number"))?;
            if !v.is_finite() || v < 0.0 {
                bail!("{name}: {v} must be a finite number of at least 0");
            }
            Ok(v)
        };
        let count = || -> Result<usize> {
            value
                .parse()
                .with_context(|| format!("{name}: `{value}` is not a whole number"))
        };
        match name.as_str() {
            "temp" | "temperature" => s.temp = float()?,
            "top-k" => s.top_k = count()?,
            "top-p" => s.top_p = unit(float()?, &name)?,
            "min-p" => s.min_p = unit(float()?, &name)?,
            "repeat-penalty" => s.repeat_penalty = float()?,
            "repeat-last-n" => s.repeat_last_n = count()?,
            "presence-penalty" => s.presence_penalty = signed(value, &name)?,
            "frequency-penalty" => s.frequency_penalty = signed(value, &name)?,
            "seed" => s.seed = Some(count()? as u64),
            "verbose" => {
                self.verbose = match value {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => bail!("verbose: on or off, not `{value}`"),
                };
            }
            _ => bail!("/set does not know `{name}`: /help lists the names"),
        }
        Ok(format!("{name} = {value}"))
    }

    /// The options as `/show` prints them.
    pub fn show(&self) -> String {
        let s = &self.sample;
        let seed = s.seed.map_or("random".to_string(), |v| v.to_string());
        let speed = match self.last {
            Some((n, secs)) if secs > 0.0 => {
                format!(
                    "last reply: {n} tokens in {secs:.2} s, {:.1} tokens/s",
                    n as f64 / secs
                )
            }
            _ => "no reply yet".into(),
        };
        format!(
            "temp {} top-k {} top-p {} min-p {} repeat-penalty {} repeat-last-n {} presence-penalty {} frequency-penalty {} seed {seed} verbose {}\n{speed}",
            s.temp, s.top_k, s.top_p, s.min_p, s.repeat_penalty, s.repeat_last_n,
            s.presence_penalty, s.frequency_penalty,
            if self.verbose { "on" } else { "off" },
        )
    }
}

fn unit(v: f32, name: &str) -> Result<f32> {
    if v > 1.0 {
        bail!("{name}: {v} is not in 0..1");
    }
    Ok(v)
}

/// A penalty in -2..2 (OpenAI's range, as the command line takes it).
fn signed(value: &str, name: &str) -> Result<f32> {
    let v: f32 = value
        .parse()
        .with_context(|| format!("{name}: `{value}` is not a number"))?;
    if !(-2.0..=2.0).contains(&v) {
        bail!("{name}: {v} is not in -2..2");
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sample: SampleArgs,
    }

    fn settings() -> Settings {
        Settings {
            sample: Cli::parse_from(["pi2"]).sample,
            verbose: false,
            last: None,
        }
    }

    #[test]
    fn set_changes_the_named_option_and_refuses_nonsense() {
        let mut s = settings();
        s.set("temp 0.2").unwrap();
        s.set("--top-k 7").unwrap();
        s.set("min_p 0.1").unwrap();
        s.set("seed 42").unwrap();
        s.set("verbose on").unwrap();
        assert_eq!(s.sample.temp, 0.2);
        assert_eq!(s.sample.top_k, 7);
        assert_eq!(s.sample.min_p, 0.1);
        assert_eq!(s.sample.seed, Some(42));
        assert!(s.verbose);
        for bad in [
            "temp",
            "temp x",
            "temp -1",
            "top-p 2",
            "top-k 1.5",
            "mirostat 2",
            "presence-penalty 3",
        ] {
            assert!(s.set(bad).is_err(), "{bad}");
        }
        assert_eq!(s.sample.temp, 0.2, "a refused value changes nothing");
        assert!(s.show().contains("top-k 7"));
    }
}
