"""The official `openai` client against a running `pi2 serve` (PI2_URL): one completion, one
chat, one streamed chat; greedy text must equal `pi2 run` on the same prompt (PI2_EXPECTED,
PI2_EXPECTED_COMPLETION). Run by crates/pi2-cli/tests/serve.rs."""

import json
import os
import sys
import urllib.request

import openai

url = os.environ["PI2_URL"]
question = os.environ["PI2_QUESTION"]
expected = os.environ["PI2_EXPECTED"]
client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

model = client.models.list().data[0].id

completion = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=12, temperature=0
)
text = completion.choices[0].text
assert text == os.environ["PI2_EXPECTED_COMPLETION"], (text, os.environ["PI2_EXPECTED_COMPLETION"])
assert completion.usage.completion_tokens == 12, completion.usage

messages = [{"role": "user", "content": question}]
chat = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
reply = chat.choices[0].message.content
assert reply == expected, (reply, expected)
assert chat.choices[0].finish_reason == "length"
assert chat.usage.total_tokens == chat.usage.prompt_tokens + 24

stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=24, temperature=0, stream=True
)
parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
assert len(parts) > 10, parts
assert "".join(parts) == expected, ("".join(parts), expected)

# An app with a hard-coded model name works unchanged: one model is served, whatever the name.
other = client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=24, temperature=0)
assert other.choices[0].message.content == expected, (other.choices[0].message.content, expected)

# Fields pi2 does not serve yet are refused by name, never answered as if honoured; their
# defaults pass.
for extra, field in [({"n": 2, "stream": True}, "n"),
                     ({"extra_body": {"suffix": "}"}}, "suffix"),
                     ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
                     ({"extra_body": {"mirostat": 2}}, "mirostat")]:
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=2, **extra)
        sys.exit(f"{field} was accepted")
    except openai.BadRequestError as e:
        assert f"`{field}`" in str(e), e
# n choices: greedy ones agree; their tokens are all counted.
many = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0, n=3)
assert [c.index for c in many.choices] == [0, 1, 2], many.choices
assert all(c.message.content == expected for c in many.choices), many.choices
assert many.usage.completion_tokens == 3 * 24, many.usage
client.chat.completions.create(model=model, messages=messages, max_tokens=2, presence_penalty=0,
                               logprobs=False, user="someone")
# logit_bias is served: banning the greedy first token changes the answer's first token.
first = client.completions.create(model=model, prompt="The capital of France is", max_tokens=1, temperature=0)
ask = urllib.request.Request(url + "/tokenize",
                             data=json.dumps({"content": first.choices[0].text}).encode(),
                             headers={"Content-Type": "application/json"})
first_id = json.load(urllib.request.urlopen(ask))["tokens"][0]
banned = client.completions.create(model=model, prompt="The capital of France is", max_tokens=1, temperature=0,
                                   logit_bias={str(first_id): -100})
assert banned.choices[0].text != first.choices[0].text, (banned.choices[0].text, first.choices[0].text)

print("openai client: completion, chat and streamed chat equal `pi2 run`; unserved fields refused")
