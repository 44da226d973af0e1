"""Structured output, tool calls and log probabilities through the official `openai` client
against a running `pi2 serve` of Qwen2.5-Coder-0.5B-Instruct (PI2_URL). Run by
crates/pi2-cli/tests/serve.rs."""

import json
import math
import os
import sys

import openai

url = os.environ["PI2_URL"]
client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
model = client.models.list().data[0].id


def check(value, schema):
    """A small JSON Schema check: types, enums, bounds, required and extra keys."""
    t = schema.get("type")
    if "enum" in schema:
        assert value in schema["enum"], (value, schema)
    if t == "object":
        assert isinstance(value, dict), value
        props = schema.get("properties", {})
        for k in schema.get("required", []):
            assert k in value, (k, value)
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(props), value
        for k, v in value.items():
            if k in props:
                check(v, props[k])
    elif t == "array":
        assert isinstance(value, list), value
        assert len(value) >= schema.get("minItems", 0), value
        assert len(value) <= schema.get("maxItems", 10**9), value
        for v in value:
            check(v, schema["items"])
    elif t == "string":
        assert isinstance(value, str), value
        assert len(value) <= schema.get("maxLength", 10**9), value
    elif t == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), value
        assert schema.get("minimum", -10**18) <= value <= schema.get("maximum", 10**18), value
    elif t == "boolean":
        assert isinstance(value, bool), value


# 1. json_schema: 20 prompts, every answer parses and validates.
schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "kind": {"enum": ["animal", "plant", "tool", "place", "food"]},
        "legs": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
        "edible": {"type": "boolean"},
    },
    "required": ["name", "kind", "legs", "tags", "edible"],
    "additionalProperties": False,
}
things = ["a cat", "an oak tree", "a hammer", "Paris", "an apple", "a spider", "a bicycle", "rice",
          "a dolphin", "a cactus", "a screwdriver", "Tokyo", "a banana", "an ant", "a horse",
          "a tulip", "a saw", "a desert", "bread", "an octopus"]
valid = 0
for thing in things:
    r = client.chat.completions.create(
        model=model, temperature=0, max_tokens=120,
        messages=[{"role": "user", "content": f"Describe {thing} as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "thing", "schema": schema, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", (thing, c.finish_reason, c.message.content)
    check(json.loads(c.message.content), schema)
    valid += 1
assert valid == 20
# json_object: any object.
r = client.chat.completions.create(model=model, temperature=0, max_tokens=80,
                                   messages=[{"role": "user", "content": "Give me a colour as JSON."}],
                                   response_format={"type": "json_object"})
assert isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content
# llama-server's GBNF `grammar` (an extra field for the client).
r = client.completions.create(model=model, prompt="Is the sky blue? Answer:", max_tokens=8,
                              temperature=0, extra_body={"grammar": 'root ::= " " ("yes" | "no") "."'})
assert r.choices[0].text in (" yes.", " no."), r.choices[0].text
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                   response_format={"type": "json_schema",
                                                    "json_schema": {"name": "x", "schema": {"type": "bogus"}}})
    sys.exit("a bad schema was accepted")
except openai.BadRequestError as e:
    assert "response_format" in str(e), e

# 2. Tool calls: a weather round trip.
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
r = client.chat.completions.create(model=model, messages=messages, tools=tools, temperature=0,
                                   max_tokens=60, tool_choice="required")
c = r.choices[0]
assert c.finish_reason == "tool_calls", (c.finish_reason, c.message)
call = c.message.tool_calls[0]
assert call.function.name == "get_weather", call
args = json.loads(call.function.arguments)
assert "paris" in args["city"].lower(), args
# Streamed, the same call arrives as a delta.
stream = client.chat.completions.create(model=model, messages=messages, tools=tools, temperature=0,
                                        max_tokens=60, tool_choice="required", stream=True)
deltas, finish = [], None
for chunk in stream:
    if chunk.choices:
        d = chunk.choices[0].delta
        deltas.extend(d.tool_calls or [])
        finish = chunk.choices[0].finish_reason or finish
assert finish == "tool_calls" and deltas[0].function.name == "get_weather", (finish, deltas)
assert json.loads(deltas[0].function.arguments) == args
# The result goes back as a `tool` message; the model answers in words.
messages += [c.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18, "sky": "sunny"})}]
r = client.chat.completions.create(model=model, messages=messages, tools=tools, temperature=0, max_tokens=60)
answer = r.choices[0].message.content
assert r.choices[0].finish_reason == "stop" and "18" in answer, (r.choices[0].finish_reason, answer)
# A named function is called even when the question does not ask for it.
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello!"}], tools=tools,
                                   temperature=0, max_tokens=60,
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
assert r.choices[0].message.tool_calls[0].function.name == "get_weather"

# 3. Log probabilities: greedy, the top alternative is the token itself; probabilities sum <= 1.
r = client.chat.completions.create(model=model, temperature=0, max_tokens=12, logprobs=True, top_logprobs=5,
                                   messages=[{"role": "user", "content": "Name a fruit."}])
content = r.choices[0].logprobs.content
assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
assert "".join(t.token for t in content) == r.choices[0].message.content
for t in content:
    assert len(t.top_logprobs) == 5
    assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6, t
    assert sum(math.exp(a.logprob) for a in t.top_logprobs) <= 1.0 + 1e-4
stream = client.chat.completions.create(model=model, temperature=0, max_tokens=12, logprobs=True,
                                        top_logprobs=1, stream=True,
                                        messages=[{"role": "user", "content": "Name a fruit."}])
streamed = [t for ch in stream if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
assert [t.token for t in streamed] == [t.token for t in content]
r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=3)
lp = r.choices[0].logprobs
assert "".join(lp.tokens) == r.choices[0].text and len(lp.top_logprobs[0]) == 3, lp
assert max(lp.top_logprobs[0].values()) == lp.token_logprobs[0]

# 4. Embeddings: similar sentences closer than unrelated ones; base64 (the client's default) and
# float agree; normalized.
dot = lambda a, b: sum(x * y for x, y in zip(a, b))
texts = ["The cat sat on the mat.", "A kitten was sitting on the rug.", "Quarterly tax filings are due in April."]
r = client.embeddings.create(model=model, input=texts)
e = [d.embedding for d in r.data]
assert abs(dot(e[0], e[0]) - 1) < 1e-4 and r.usage.prompt_tokens > 0, r.usage
assert dot(e[0], e[1]) > dot(e[0], e[2]) and dot(e[0], e[1]) > dot(e[1], e[2]), (dot(e[0], e[1]), dot(e[0], e[2]))
f = client.embeddings.create(model=model, input=texts[0], encoding_format="float").data[0].embedding
assert abs(dot(f, e[0]) - 1) < 1e-4
try:
    client.embeddings.create(model=model, input=texts[0], dimensions=7)
    sys.exit("dimensions was accepted")
except openai.BadRequestError as err:
    assert "dimensions" in str(err), err

print("structured: 20/20 json_schema answers valid; tool round trip whole and streamed; logprobs consistent; embeddings rank similar sentences closer")
