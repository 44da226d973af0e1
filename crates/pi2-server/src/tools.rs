//! Tool calls: OpenAI's `tools` and `tool_choice` into the chat template (its own `tools`
//! variable, or a system message for templates without one) and, for `required` or a named
//! function, a grammar the answer must follow; the model's calls parsed back into
//! `tool_calls`, whole or streamed, in the forms the families' templates teach:
//! `<tool_call>{"name": .., "arguments": ..}</tool_call>` blocks (Qwen, Hermes), an answer that
//! is a call object or a list of them (Llama 3.x's `{"name", "parameters"}`), fenced as
//! ```` ```json ```` or not, and Mistral's `[TOOL_CALLS]` (a list of calls, or `NAME[ARGS]{..}`
//! repeated).

use crate::api::CompletionRequest;
use crate::error::ApiError;
use crate::wire::{FunctionDef, ToolChoice};
use pi2_grammar::GrammarSpec;
use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const MISTRAL: &str = "[TOOL_CALLS]";

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

/// `<tool_call>` blocks (one, or with `parallel` one or more), each a call of one of `defs`
/// with arguments valid against its parameters.
fn calls_grammar(defs: &[&FunctionDef], parallel: bool) -> GrammarSpec {
    let one_of: Vec<Value> = defs
        .iter()
        .map(|f| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": f.name},
                    "arguments": f.parameters.clone().unwrap_or(json!({"type": "object"})),
                },
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = json!({
        "anyOf": one_of,
        "x-guidance": {"whitespace_pattern": r"[\x20\x0A]{0,4}"},
    });
    let more = if parallel { " (\"\\n\" call)*" } else { "" };
    GrammarSpec::Lark(format!(
        "start: call{more}\ncall: \"{OPEN}\\n\" %json {schema} \"\\n{CLOSE}\"\n"
    ))
}

/// The system message for a template that cannot show tools: the functions and the format.
pub fn tools_prompt(tools: &Value) -> String {
    let list: Vec<String> = tools
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["function"].to_string())
        .collect();
    format!(
        "You may call functions. They are, as JSON signatures:\n<tools>\n{}\n</tools>\nTo call one, answer with {OPEN}\n{{\"name\": <function-name>, \"arguments\": <arguments-json-object>}}\n{CLOSE}",
        list.join("\n")
    )
}

/// Calls parsed from a whole answer: the text before the first call, and each call's name
/// and arguments (JSON text). `names` are the functions offered: a bare JSON object naming
/// one of them is a call too.
pub fn parse_calls(text: &str, names: &[String]) -> (String, Vec<(String, String)>) {
    let mut calls = Vec::new();
    let Some(first) = text.find(OPEN) else {
        return match whole_answer_calls(text, names) {
            Some(c) => (String::new(), c),
            None => (text.to_string(), calls),
        };
    };
    let mut rest = &text[first..];
    while let Some(start) = rest.find(OPEN) {
        let body = &rest[start + OPEN.len()..];
        let end = body.find(CLOSE).unwrap_or(body.len());
        if let Some(c) = call_of(body[..end].trim(), names) {
            calls.push(c);
        }
        rest = &body[(end + CLOSE.len()).min(body.len())..];
    }
    if calls.is_empty() {
        return (text.to_string(), calls);
    }
    (text[..first].trim_end().to_string(), calls)
}

/// An answer that is nothing but calls: a call object or a list of them, fenced as
/// ```` ```json ```` or not, or Mistral's `[TOOL_CALLS]` forms. Every call must name an offered
/// function; anything else is content.
fn whole_answer_calls(text: &str, names: &[String]) -> Option<Vec<(String, String)>> {
    let t = text.trim();
    if let Some(rest) = t.strip_prefix(MISTRAL) {
        return mistral_calls(rest.trim_start(), names);
    }
    let t = match t.strip_prefix("```json").or_else(|| t.strip_prefix("```")) {
        Some(fenced) => fenced.strip_suffix("```")?.trim(),
        None => t,
    };
    match serde_json::from_str::<Value>(t).ok()? {
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|v| call_of(&v.to_string(), names))
            .collect(),
        Value::Object(_) => Some(vec![call_of(t, names)?]),
        _ => None,
    }
}

/// Mistral's calls after `[TOOL_CALLS]`: a JSON list of call objects, or `NAME[ARGS]{..}`
/// repeated (its newer templates).
fn mistral_calls(rest: &str, names: &[String]) -> Option<Vec<(String, String)>> {
    if rest.starts_with('[') {
        return whole_answer_calls(rest, names);
    }
    let mut calls = Vec::new();
    for part in rest.split(MISTRAL).map(str::trim).filter(|p| !p.is_empty()) {
        let (name, args) = part.split_once("[ARGS]")?;
        let name = name.trim();
        let args: Value = serde_json::from_str(args.trim()).ok()?;
        if !names.iter().any(|n| n == name) {
            return None;
        }
        calls.push((name.to_string(), args.to_string()));
    }
    (!calls.is_empty()).then_some(calls)
}

/// `{"name": ..., "arguments": {...}}` (or `parameters`) naming an offered function.
fn call_of(s: &str, names: &[String]) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(s).ok()?;
    let name = v.get("name")?.as_str()?;
    if !names.iter().any(|n| n == name) {
        return None;
    }
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or(json!({}));
    let args = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some((name.to_string(), args))
}

/// The `tool_calls` list of an answer.
pub fn calls_json(calls: &[(String, String)], id_base: &str) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({
                "index": i,
                "id": format!("call_{id_base}_{i}"),
                "type": "function",
                "function": {"name": name, "arguments": args},
            })
        })
        .collect()
}

/// Streamed text with tools offered: plain text is passed on as it comes; from where a call may
/// begin (`<tool_call>`, or a `{` opening the answer) it is held, and parsed at the end.
#[derive(Default)]
pub struct ToolStream {
    all: String,
    /// Bytes of `all` already passed on.
    sent: usize,
}

impl ToolStream {
    /// Takes generated text; returns what can be shown as content now.
    pub fn push(&mut self, text: &str) -> String {
        self.all.push_str(text);
        let pending = &self.all[self.sent..];
        // An answer that opens as a call may be one: held whole (see `whole_answer_calls`).
        let start = self.all.trim_start();
        let may_be_call = ["{", "[", "```json", MISTRAL].iter().any(|p| {
            start.starts_with(p) || (p.len() > 1 && p.starts_with(start) && self.sent == 0)
        });
        if may_be_call || self.all[..self.sent].contains(OPEN) {
            return String::new();
        }
        let held = match pending.find(OPEN) {
            Some(at) => at,
            // Keep a tail that may be the start of `<tool_call>`.
            None => (1..OPEN.len().min(pending.len()) + 1)
                .rev()
                .find(|&k| {
                    pending.is_char_boundary(pending.len() - k)
                        && OPEN.starts_with(&pending[pending.len() - k..])
                })
                .map_or(pending.len(), |k| pending.len() - k),
        };
        let out = pending[..held].to_string();
        self.sent += held;
        out
    }

    /// At the end: content not yet passed on, and the calls.
    pub fn finish(self, names: &[String]) -> (String, Vec<(String, String)>) {
        let (content, calls) = parse_calls(&self.all, names);
        match calls.is_empty() {
            true => (self.all[self.sent..].to_string(), calls),
            false => (content.get(self.sent..).unwrap_or("").to_string(), calls),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".into()]
    }

    #[test]
    fn calls_are_parsed_from_qwen_blocks_and_bare_objects() {
        let t = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = parse_calls(t, &names());
        assert_eq!(content, "Let me check.");
        assert_eq!(
            calls,
            vec![("get_weather".into(), "{\"city\":\"Paris\"}".into())]
        );
        let (c, calls) = parse_calls("{\"name\": \"get_weather\", \"parameters\": {}}", &names());
        assert_eq!((c.as_str(), calls.len()), ("", 1));
        // Unknown functions and plain text are content.
        let (c, calls) = parse_calls("<tool_call>{\"name\": \"rm\"}</tool_call>", &names());
        assert!(calls.is_empty() && c.contains("rm"));
        assert_eq!(parse_calls("Sunny.", &names()).0, "Sunny.");
    }

    #[test]
    fn calls_are_parsed_in_each_family_form() {
        let one = vec![(
            "get_weather".to_string(),
            "{\"city\":\"Paris\"}".to_string(),
        )];
        for t in [
            // Llama 3.x: a bare object with `parameters`, fenced or not.
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
            // A list of calls.
            "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
            // Mistral's two forms.
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
        ] {
            assert_eq!(
                parse_calls(t, &names()),
                (String::new(), one.clone()),
                "{t}"
            );
        }
        let two =
            "[TOOL_CALLS]get_weather[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}";
        assert_eq!(parse_calls(two, &names()).1.len(), 2);
        // A list with an unknown function, a fence around prose, plain arrays: content.
        for t in [
            "[{\"name\": \"get_weather\"}, {\"name\": \"rm\"}]",
            "```json\n[1, 2]\n```",
            "[TOOL_CALLS]rm[ARGS]{}",
            "[1, 2, 3]",
        ] {
            let (content, calls) = parse_calls(t, &names());
            assert!(calls.is_empty() && content == t, "{t}");
        }
        // Streamed: an answer opening as a call is held, then parsed.
        let mut s = ToolStream::default();
        assert_eq!(s.push("[TOOL"), "");
        assert_eq!(s.push("_CALLS]get_weather[ARGS]{}"), "");
        assert_eq!(s.finish(&names()).1.len(), 1);
    }

    #[test]
    fn a_stream_holds_what_may_be_a_call() {
        let mut s = ToolStream::default();
        let mut shown = s.push("It is ");
        shown += &s.push("sunny <tool");
        assert_eq!(shown, "It is sunny ");
        shown += &s.push("_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>");
        assert_eq!(shown, "It is sunny ");
        let (rest, calls) = s.finish(&names());
        assert_eq!((rest.as_str(), calls.len()), ("", 1));
        let mut s = ToolStream::default();
        assert_eq!(s.push("a <b"), "a <b");
        assert_eq!(s.push("> <tool_"), "> ");
        assert_eq!(s.finish(&names()), ("<tool_".to_string(), vec![]));
    }

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
