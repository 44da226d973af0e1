//! Tool calls: OpenAI's `tools` and `tool_choice` into the chat template (its own `tools`
//! variable, or a system message for templates without one) and, for `required` or a named
//! function, a grammar the answer must follow. The model's calls are read back into
//! `tool_calls` by [`pi2_model::answer`], in the form its template teaches.

use crate::api::CompletionRequest;
use crate::error::ApiError;
use crate::wire::{FunctionDef, ToolChoice};
use pi2_grammar::GrammarSpec;
use serde_json::{json, Value};

/// What a request's tools ask of the generation.
#[derive(Debug)]
pub struct ToolPlan {
    /// The functions as the template's `tools` variable takes them.
    pub tools: Value,
    /// Names the model may call.
    pub names: Vec<String>,
    /// `required` or a named function: the answer is held to calls by a grammar.
    pub grammar: Option<GrammarSpec>,
    /// Calls one answer may make (`parallel_tool_calls: false`: one).
    pub max_calls: usize,
}

impl CompletionRequest {
    /// The request's tools (`None`: no tools, or `tool_choice: none`).
    pub fn tool_plan(&self) -> Result<Option<ToolPlan>, ApiError> {
        let tools = self.tools.as_deref().unwrap_or(&[]);
        let choice = match &self.tool_choice {
            None => "auto",
            Some(ToolChoice::Mode(m)) if ["auto", "none", "required"].contains(&m.as_str()) => m,
            Some(ToolChoice::Mode(m)) => {
                return Err(ApiError::bad(format!(
                    "`tool_choice` `{m}` is not one of auto, none, required, or a function"
                ))
                .param("tool_choice"))
            }
            Some(ToolChoice::Named { .. }) => "named",
        };
        if tools.is_empty() {
            return match choice {
                "auto" | "none" => Ok(None),
                _ => Err(
                    ApiError::bad("`tool_choice` asks for a call but `tools` is empty")
                        .param("tool_choice"),
                ),
            };
        }
        if choice == "none" {
            return Ok(None);
        }
        let mut defs = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            match (&*t.kind, &t.function) {
                ("function", Some(f)) if !f.name.is_empty() => defs.push(f),
                _ => {
                    return Err(ApiError::bad(
                        "each tool is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                    .param(format!("tools[{i}]")))
                }
            }
        }
        let names: Vec<String> = defs.iter().map(|f| f.name.clone()).collect();
        let allowed: Vec<&FunctionDef> = match &self.tool_choice {
            Some(ToolChoice::Named { function }) => {
                let f = defs
                    .iter()
                    .find(|f| f.name == function.name)
                    .ok_or_else(|| {
                        ApiError::bad(format!(
                            "`tool_choice` names `{}`, which is not in `tools`",
                            function.name
                        ))
                        .param("tool_choice")
                    })?;
                vec![*f]
            }
            _ => defs.clone(),
        };
        let parallel = self.parallel_tool_calls.unwrap_or(true);
        let grammar = (choice != "auto").then(|| calls_grammar(&allowed, parallel));
        let tools = defs
            .iter()
            .map(|f| json!({"type": "function", "function": f}))
            .collect();
        Ok(Some(ToolPlan {
            tools: Value::Array(tools),
            names,
            grammar,
            max_calls: if parallel { usize::MAX } else { 1 },
        }))
    }
}

/// The Lark grammar of calls of `defs` (see [`pi2_model::answer::calls::calls_lark`]).
fn calls_grammar(defs: &[&FunctionDef], parallel: bool) -> GrammarSpec {
    let functions: Vec<(&str, Option<&Value>)> = defs
        .iter()
        .map(|f| (f.name.as_str(), f.parameters.as_ref()))
        .collect();
    GrammarSpec::Lark(pi2_model::answer::calls::calls_lark(&functions, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_checked_and_required_gets_a_grammar() {
        let req = |s: &str| CompletionRequest::parse(s.as_bytes()).unwrap();
        let tools = r#""tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]"#;
        let auto = req(&format!("{{{tools}}}")).tool_plan().unwrap().unwrap();
        assert!(auto.grammar.is_none());
        let required = req(&format!("{{{tools},\"tool_choice\":\"required\"}}"))
            .tool_plan()
            .unwrap()
            .unwrap();
        assert!(
            matches!(required.grammar, Some(GrammarSpec::Lark(ref g)) if g.contains("get_weather"))
        );
        assert!(req(&format!("{{{tools},\"tool_choice\":\"none\"}}"))
            .tool_plan()
            .unwrap()
            .is_none());
        let single = req(&format!(
            "{{{tools},\"tool_choice\":\"required\",\"parallel_tool_calls\":false}}"
        ))
        .tool_plan()
        .unwrap()
        .unwrap();
        assert_eq!(single.max_calls, 1);
        assert!(
            matches!(single.grammar, Some(GrammarSpec::Lark(ref g)) if g.starts_with("start: call\n"))
        );
        for body in [
            format!("{{{tools},\"tool_choice\":{{\"type\":\"function\",\"function\":{{\"name\":\"nope\"}}}}}}"),
            format!("{{{tools},\"tool_choice\":\"sometimes\"}}"),
            "{\"tool_choice\":\"required\"}".to_string(),
            "{\"tools\":[{\"type\":\"retrieval\"}]}".to_string(),
        ] {
            assert!(req(&body).tool_plan().is_err(), "{body}");
        }
    }
}
