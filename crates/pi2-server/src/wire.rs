//! Request parts as OpenAI clients send them (response formats, log probabilities, tools),
//! read into [`crate::api::CompletionRequest`]; what they ask is worked out in
//! [`crate::guided`] and [`crate::tools`].

use serde::Deserialize;
use serde_json::Value;

/// OpenAI's `response_format`.
#[derive(Debug, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
    /// llama-server's shorthand: `{"type": "json_object", "schema": {...}}`.
    pub schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub schema: Option<Value>,
    /// Always kept to: the grammar allows only what validates.
    pub strict: Option<bool>,
    pub description: Option<String>,
}

/// `logprobs` as chat (a switch) or legacy completions (how many alternatives) send it.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Logprobs {
    On(bool),
    Top(u64),
}

/// One entry of `tools`.
#[derive(Debug, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Option<FunctionDef>,
}

#[derive(Debug, Deserialize, serde::Serialize)]
pub struct FunctionDef {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`: a mode, or one function by name.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named { function: NamedFunction },
}

#[derive(Debug, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// A call made in an assistant message the client sends back.
#[derive(Debug, Deserialize)]
pub struct InToolCall {
    pub id: Option<String>,
    pub function: InFunction,
}

#[derive(Debug, Deserialize)]
pub struct InFunction {
    pub name: String,
    /// A JSON text, as OpenAI sends it (an object is taken too).
    pub arguments: Value,
}
