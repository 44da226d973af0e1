//! Function calls read from an answer's content, in the forms the families' templates teach:
//! `<tool_call>{"name": .., "arguments": ..}</tool_call>` blocks (Qwen, Hermes; harmony's calls
//! arrive in this form too), Gemma 4's `<|tool_call>call:NAME{..}<tool_call|>`, an answer that
//! is a call object or a list of them (Llama 3.x's `{"name", "parameters"}`), fenced as
//! ```` ```json ```` or not, and Mistral's `[TOOL_CALLS]` (a list of calls, or `NAME[ARGS]{..}`
//! repeated). Every call must name an offered function, or the text stays content.

use super::Dialect;
use serde_json::{json, Value};

/// A call: the function's name and its arguments as JSON text.
pub type Call = (String, String);

const MISTRAL: &str = "[TOOL_CALLS]";

/// How a dialect marks a call in running text.
struct Block {
    open: &'static str,
    close: &'static str,
    /// The call inside the markers.
    read: fn(&str, &[String]) -> Option<Call>,
}

const JSON_BLOCK: Block = Block {
    open: "<tool_call>",
    close: "</tool_call>",
    read: call_of,
};

const GEMMA4_BLOCK: Block = Block {
    open: "<|tool_call>",
    close: "<tool_call|>",
    read: gemma4_call,
};

/// The call blocks an answer in `dialect` may hold: its own, then the `<tool_call>` form pi2
/// teaches where a template cannot show tools and holds a required call to by grammar.
fn blocks(dialect: Dialect) -> &'static [Block] {
    match dialect {
        Dialect::Gemma4 => &[GEMMA4_BLOCK, JSON_BLOCK],
        Dialect::ThinkTags | Dialect::Harmony => &[JSON_BLOCK],
    }
}

/// Calls parsed from a whole answer's content: the text before the first call, and the calls.
/// `names` are the functions offered.
pub fn parse_calls(text: &str, names: &[String], dialect: Dialect) -> (String, Vec<Call>) {
    let found = blocks(dialect)
        .iter()
        .find_map(|b| text.find(b.open).map(|at| (b, at)));
    let Some((&Block { open, close, read }, first)) = found else {
        return match whole_answer_calls(text, names) {
            Some(c) => (String::new(), c),
            None => (text.to_string(), Vec::new()),
        };
    };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(open) {
        let body = &rest[start + open.len()..];
        let end = body.find(close).unwrap_or(body.len());
        if let Some(c) = read(body[..end].trim(), names) {
            calls.push(c);
        }
        rest = &body[(end + close.len()).min(body.len())..];
    }
    if calls.is_empty() {
        return (text.to_string(), calls);
    }
    (text[..first].trim_end().to_string(), calls)
}

/// An answer that is nothing but calls: a call object or a list of them, fenced as
/// ```` ```json ```` or not, or Mistral's `[TOOL_CALLS]` forms.
fn whole_answer_calls(text: &str, names: &[String]) -> Option<Vec<Call>> {
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
fn mistral_calls(rest: &str, names: &[String]) -> Option<Vec<Call>> {
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
fn call_of(s: &str, names: &[String]) -> Option<Call> {
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

/// Gemma 4's `call:NAME{key:value,..}`, values written as its template writes them: strings
/// between `<|"|>` marks, objects with bare keys, lists, JSON numbers, `true`, `false`, `null`.
fn gemma4_call(s: &str, names: &[String]) -> Option<Call> {
    let rest = s.strip_prefix("call:")?;
    let brace = rest.find('{')?;
    let name = rest[..brace].trim();
    if !names.iter().any(|n| n == name) {
        return None;
    }
    let mut r = GemmaReader {
        s: &rest[brace..],
        depth: 0,
    };
    let args = r.value()?;
    (args.is_object() && r.s.trim().is_empty()).then(|| (name.to_string(), args.to_string()))
}

/// Reads Gemma 4's argument values; nesting is bounded (the text is the model's).
struct GemmaReader<'a> {
    s: &'a str,
    depth: usize,
}

const QUOTE: &str = "<|\"|>";
const MAX_DEPTH: usize = 64;

impl GemmaReader<'_> {
    fn skip_space(&mut self) {
        self.s = self.s.trim_start();
    }

    fn eat(&mut self, text: &str) -> bool {
        self.skip_space();
        match self.s.strip_prefix(text) {
            Some(rest) => {
                self.s = rest;
                true
            }
            None => false,
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.skip_space();
        if self.eat(QUOTE) {
            let end = self.s.find(QUOTE)?;
            let text = self.s[..end].to_string();
            self.s = &self.s[end + QUOTE.len()..];
            return Some(Value::String(text));
        }
        if self.s.starts_with('{') || self.s.starts_with('[') {
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return None;
            }
            let v = match self.eat("{") {
                true => self.object(),
                false => self.eat("[").then(|| self.list())?,
            };
            self.depth -= 1;
            return v;
        }
        let end = self.s.find([',', '}', ']']).unwrap_or(self.s.len());
        let v = serde_json::from_str::<Value>(self.s[..end].trim()).ok()?;
        self.s = &self.s[end..];
        (!v.is_object() && !v.is_array()).then_some(v)
    }

    fn object(&mut self) -> Option<Value> {
        let mut map = serde_json::Map::new();
        if self.eat("}") {
            return Some(Value::Object(map));
        }
        loop {
            let key = match self.eat(QUOTE) {
                true => {
                    let end = self.s.find(QUOTE)?;
                    let k = self.s[..end].to_string();
                    self.s = &self.s[end + QUOTE.len()..];
                    k
                }
                false => {
                    let end = self.s.find(':')?;
                    let k = self.s[..end].trim().to_string();
                    self.s = &self.s[end..];
                    k
                }
            };
            if key.is_empty() || !self.eat(":") {
                return None;
            }
            let v = self.value()?;
            map.insert(key, v);
            if self.eat("}") {
                return Some(Value::Object(map));
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    fn list(&mut self) -> Option<Value> {
        let mut items = Vec::new();
        if self.eat("]") {
            return Some(Value::Array(items));
        }
        loop {
            items.push(self.value()?);
            if self.eat("]") {
                return Some(Value::Array(items));
            }
            if !self.eat(",") {
                return None;
            }
        }
    }
}

/// The system message for a template that cannot show tools (`tools`: OpenAI's list of
/// `{"type": "function", "function": {..}}`): the functions and the `<tool_call>` form.
pub fn tools_prompt(tools: &Value) -> String {
    let list: Vec<String> = tools
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["function"].to_string())
        .collect();
    format!(
        "You may call functions. They are, as JSON signatures:\n<tools>\n{}\n</tools>\nTo call one, answer with {}\n{{\"name\": <function-name>, \"arguments\": <arguments-json-object>}}\n{}",
        list.join("\n"),
        JSON_BLOCK.open,
        JSON_BLOCK.close,
    )
}

/// A Lark grammar (llguidance's) of `<tool_call>` blocks (one, or with `parallel` one or
/// more), each a call of one of `functions` (name, JSON-schema parameters) with arguments
/// valid against its parameters: what a required call is held to.
pub fn calls_lark(functions: &[(&str, Option<&Value>)], parallel: bool) -> String {
    let one_of: Vec<Value> = functions
        .iter()
        .map(|(name, parameters)| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": name},
                    "arguments": parameters.cloned().unwrap_or(json!({"type": "object"})),
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
    format!(
        "start: call{more}\ncall: \"{}\\n\" %json {schema} \"\\n{}\"\n",
        JSON_BLOCK.open, JSON_BLOCK.close
    )
}

/// The `tool_calls` list of an answer (OpenAI's shape).
pub fn calls_json(calls: &[Call], id_base: &str) -> Value {
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

/// Streamed content with tools offered: plain text is passed on as it comes; from where a call
/// may begin (the dialect's opening marker, or a `{` opening the answer) it is held, and parsed
/// at the end.
pub struct CallStream {
    dialect: Dialect,
    all: String,
    /// Bytes of `all` already passed on.
    sent: usize,
}

impl CallStream {
    pub fn new(dialect: Dialect) -> Self {
        CallStream {
            dialect,
            all: String::new(),
            sent: 0,
        }
    }

    /// Takes content; returns what can be shown now.
    pub fn push(&mut self, text: &str) -> String {
        let opens = blocks(self.dialect).iter().map(|b| b.open);
        self.all.push_str(text);
        let pending = &self.all[self.sent..];
        // An answer that opens as a call may be one: held whole (see `whole_answer_calls`).
        let start = self.all.trim_start();
        let may_be_call = ["{", "[", "```json", MISTRAL].iter().any(|p| {
            start.starts_with(p) || (p.len() > 1 && p.starts_with(start) && self.sent == 0)
        });
        if may_be_call || opens.clone().any(|o| self.all[..self.sent].contains(o)) {
            return String::new();
        }
        let held = opens
            .map(|open| match pending.find(open) {
                Some(at) => at,
                None => pending.len() - super::partial_tag(pending, open),
            })
            .min()
            .unwrap_or(pending.len());
        let out = pending[..held].to_string();
        self.sent += held;
        out
    }

    /// At the end: content not yet passed on, and the calls.
    pub fn finish(self, names: &[String]) -> (String, Vec<Call>) {
        let (content, calls) = parse_calls(&self.all, names, self.dialect);
        match calls.is_empty() {
            true => (self.all[self.sent..].to_string(), calls),
            false => (content.get(self.sent..).unwrap_or("").to_string(), calls),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Dialect = Dialect::ThinkTags;

    fn names() -> Vec<String> {
        vec!["get_weather".into()]
    }

    #[test]
    fn calls_are_parsed_from_qwen_blocks_and_bare_objects() {
        let t = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = parse_calls(t, &names(), D);
        assert_eq!(content, "Let me check.");
        assert_eq!(
            calls,
            vec![("get_weather".into(), "{\"city\":\"Paris\"}".into())]
        );
        let (c, calls) = parse_calls(
            "{\"name\": \"get_weather\", \"parameters\": {}}",
            &names(),
            D,
        );
        assert_eq!((c.as_str(), calls.len()), ("", 1));
        // Unknown functions and plain text are content.
        let (c, calls) = parse_calls("<tool_call>{\"name\": \"rm\"}</tool_call>", &names(), D);
        assert!(calls.is_empty() && c.contains("rm"));
        assert_eq!(parse_calls("Sunny.", &names(), D).0, "Sunny.");
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
                parse_calls(t, &names(), D),
                (String::new(), one.clone()),
                "{t}"
            );
        }
        let two =
            "[TOOL_CALLS]get_weather[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}";
        assert_eq!(parse_calls(two, &names(), D).1.len(), 2);
        // A list with an unknown function, a fence around prose, plain arrays: content.
        for t in [
            "[{\"name\": \"get_weather\"}, {\"name\": \"rm\"}]",
            "```json\n[1, 2]\n```",
            "[TOOL_CALLS]rm[ARGS]{}",
            "[1, 2, 3]",
        ] {
            let (content, calls) = parse_calls(t, &names(), D);
            assert!(calls.is_empty() && content == t, "{t}");
        }
        // Streamed: an answer opening as a call is held, then parsed.
        let mut s = CallStream::new(D);
        assert_eq!(s.push("[TOOL"), "");
        assert_eq!(s.push("_CALLS]get_weather[ARGS]{}"), "");
        assert_eq!(s.finish(&names()).1.len(), 1);
    }

    #[test]
    fn a_stream_holds_what_may_be_a_call() {
        let mut s = CallStream::new(D);
        let mut shown = s.push("It is ");
        shown += &s.push("sunny <tool");
        assert_eq!(shown, "It is sunny ");
        shown += &s.push("_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>");
        assert_eq!(shown, "It is sunny ");
        let (rest, calls) = s.finish(&names());
        assert_eq!((rest.as_str(), calls.len()), ("", 1));
        let mut s = CallStream::new(D);
        assert_eq!(s.push("a <b"), "a <b");
        assert_eq!(s.push("> <tool_"), "> ");
        assert_eq!(s.finish(&names()), ("<tool_".to_string(), vec![]));
    }

    #[test]
    fn gemma4_calls_are_read_from_its_own_notation() {
        let t = "I will look.<|tool_call>call:get_weather{city:<|\"|>Paris, FR<|\"|>,days:3,units:{metric:true,list:[1,<|\"|>a<|\"|>,null]}}<tool_call|>";
        let (content, calls) = parse_calls(t, &names(), Dialect::Gemma4);
        assert_eq!(content, "I will look.");
        let args: Value = serde_json::from_str(&calls[0].1).unwrap();
        assert_eq!(
            args,
            json!({"city": "Paris, FR", "days": 3, "units": {"metric": true, "list": [1, "a", null]}})
        );
        // Unknown functions, broken or deep arguments: content.
        let deep = format!(
            "<|tool_call>call:get_weather{{a:{}1{}}}<tool_call|>",
            "[".repeat(100),
            "]".repeat(100)
        );
        for t in [
            "<|tool_call>call:rm{}<tool_call|>",
            "<|tool_call>call:get_weather{city:<|\"|>Paris}<tool_call|>",
            "<|tool_call>call:get_weather{city Paris}<tool_call|>",
            deep.as_str(),
        ] {
            let (content, calls) = parse_calls(t, &names(), Dialect::Gemma4);
            assert!(calls.is_empty() && content == t, "{t}");
        }
        // Streamed: held from the marker on.
        let mut s = CallStream::new(Dialect::Gemma4);
        let mut shown = s.push("Sure <|tool");
        shown += &s.push("_call>call:get_weather{}<tool_call|>");
        assert_eq!(shown, "Sure ");
        assert_eq!(
            s.finish(&names()).1,
            vec![("get_weather".into(), "{}".into())]
        );
    }
}
