//! llama-server's native `/completion` (and `/completions`): its request forms (text, token
//! ids, both mixed; `n_predict`, `n_probs`, `stop`) and its answer's shape, whole and streamed,
//! with the same text `pi2 run` gives and `/v1/completions` gives.

mod common;

use common::server::{chat_stream, http, post, sse_data, Server};
use serde_json::{json, Value};

const PROMPT: &str = "The capital of France is";

#[test]
fn native_completion_answers_as_llama_server_does() {
    let s = Server::start(&[]);
    let oai = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(oai.status, 200, "{}", oai.body);
    let want = oai.json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();

    let body = json!({"prompt": PROMPT, "n_predict": 8, "temperature": 0});
    let r = post(&s.addr, "/completion", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["content"], want.as_str(), "{v}");
    assert_eq!(v["stop"], true);
    assert_eq!(v["stop_type"], "limit");
    assert_eq!(v["tokens_predicted"], 8);
    assert!(v["tokens_evaluated"].as_u64().unwrap() > 0);
    assert_eq!(v["generation_settings"]["n_predict"], 8);
    assert!(v["prompt"].as_str().unwrap().ends_with(PROMPT), "{v}");
    assert!(v["timings"]["predicted_n"].as_u64().is_some(), "{v}");
    assert!(v.get("choices").is_none());

    // The same as token ids, and mixed with text; `/completions` is the same route.
    let ids = post(
        &s.addr,
        "/tokenize",
        &json!({"content": PROMPT, "add_special": true}),
    );
    let ids = ids.json()["tokens"].clone();
    let r = post(
        &s.addr,
        "/completions",
        &json!({"prompt": ids, "n_predict": 8, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["content"], want.as_str());
    let n = ids.as_array().unwrap().len();
    let r = post(
        &s.addr,
        "/completion",
        &json!({"prompt": [PROMPT, 13], "n_predict": 2, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["tokens_evaluated"], n as u64 + 1, "{}", r.body);

    // Streamed: `content` pieces, a last chunk with `stop: true` and the counts, no [DONE].
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post(&s.addr, "/completion", &streamed);
    assert_eq!(r.status, 200);
    let chunks: Vec<Value> = sse_data(&r.body)
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{d}: {e}")))
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["content"].as_str())
        .collect();
    assert_eq!(text, want);
    let last = chunks.last().unwrap();
    assert_eq!(last["stop"], true, "{last}");
    assert_eq!(last["tokens_predicted"], 8, "{last}");
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["stop"] == false));

    // A stop string: `stop_type` word and the word; `n_probs`: each token's alternatives.
    let first_word = want.split_whitespace().next().unwrap().to_string();
    let r = post(
        &s.addr,
        "/completion",
        &json!({"prompt": PROMPT, "n_predict": 8, "temperature": 0, "stop": [first_word],
                "n_probs": 3}),
    );
    let v = r.json();
    assert_eq!(v["stop_type"], "word", "{v}");
    assert_eq!(v["stopping_word"], first_word.as_str());
    let probs = v["completion_probabilities"].as_array().unwrap();
    assert!(!probs.is_empty(), "{v}");
    assert_eq!(probs[0]["top_logprobs"].as_array().unwrap().len(), 3);
    assert!(probs[0]["id"].as_u64().is_some() && probs[0]["logprob"].as_f64().unwrap() <= 0.0);

    // Refused by name: an id outside the vocabulary, OpenAI's `logprobs` here.
    let r = post(&s.addr, "/completion", &json!({"prompt": [1, 99999999]}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("99999999 is not a token id"), "{}", r.body);
    let r = post(
        &s.addr,
        "/completion",
        &json!({"prompt": PROMPT, "logprobs": 2}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    // Token ids on the OpenAI route too (its API allows them): the same answer.
    let r = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], want.as_str());
    // `n_probs` on the OpenAI route: its `logprobs` with that many alternatives.
    let r = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 2, "n_probs": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let lp = &r.json()["choices"][0]["logprobs"];
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2, "{lp}");
}

/// `/infill` as llama-server builds it (its `format_prompt_infill`): the other files after the
/// repository and file separators, then prefix marker, prefix, suffix marker, suffix, middle
/// marker; answered as a native completion. A model without FIM tokens is refused by name.
#[test]
fn infill_fills_the_middle_with_the_models_fim_tokens() {
    let plain = Server::start(&[]);
    let body = json!({"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
                      "input_extra": [{"filename": "util.py", "text": "X = 1\n"}],
                      "n_predict": 8, "temperature": 0});
    let r = post(&plain.addr, "/infill", &body);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("no fill-in-the-middle tokens"),
        "{}",
        r.body
    );
    let r = post(
        &plain.addr,
        "/completion",
        &json!({"prompt": "x", "input_prefix": "a"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("`input_prefix` is for /infill"),
        "{}",
        r.body
    );
    drop(plain);

    let qwen = common::root().join("models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf");
    let s = Server::start_model(qwen.to_str().unwrap(), &["-c", "4096"]);
    let r = post(&s.addr, "/infill", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(!v["content"].as_str().unwrap().is_empty(), "{v}");
    // The same tokens, laid out by hand from llama.cpp's recipe, through /completion.
    let ids = |text: &str| -> Vec<Value> {
        let r = post(
            &s.addr,
            "/tokenize",
            &json!({"content": text, "parse_special": false}),
        );
        r.json()["tokens"].as_array().unwrap().clone()
    };
    let special = |text: &str| -> Value {
        let r = post(&s.addr, "/tokenize", &json!({"content": text}));
        let t = r.json()["tokens"].as_array().unwrap().clone();
        assert_eq!(t.len(), 1, "{text}: {t:?}");
        t[0].clone()
    };
    let mut prompt = vec![special("<|repo_name|>")];
    prompt.extend(ids("myproject\n"));
    prompt.push(special("<|file_sep|>"));
    prompt.extend(ids("util.py\n"));
    prompt.extend(ids("X = 1\n"));
    prompt.push(special("<|file_sep|>"));
    prompt.extend(ids("filename\n"));
    prompt.push(special("<|fim_prefix|>"));
    prompt.extend(ids("def add(a, b):\n    return "));
    prompt.push(special("<|fim_suffix|>"));
    prompt.extend(ids("\n\nprint(add(1, 2))\n"));
    prompt.push(special("<|fim_middle|>"));
    assert_eq!(v["tokens_evaluated"], prompt.len() as u64, "{v}");
    let by_hand = post(
        &s.addr,
        "/completion",
        &json!({"prompt": prompt, "n_predict": 8, "temperature": 0}),
    );
    assert_eq!(by_hand.json()["content"], v["content"]);
}

/// llama-server's `GET /slots`: one entry per slot, idle between requests, with the tokens its
/// KV cache kept from the last one; and its slot actions: a slot's cache saved to a file of
/// `--slot-save-path`, erased, restored into another slot (whose next request then reuses it and
/// answers the same), bad names, files and slots refused by name.
#[test]
fn slots_list_each_slot_and_save_erase_and_restore_their_caches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let s = Server::start(&["--parallel", "2", "--slot-save-path", path]);
    let list = |s: &Server| -> Vec<Value> {
        let r = http(&s.addr, "GET", "/slots", &[], b"");
        assert_eq!(r.status, 200, "{}", r.body);
        r.json().as_array().unwrap().clone()
    };
    let before = list(&s);
    assert_eq!(before.len(), 2, "{before:?}");
    assert!(before
        .iter()
        .all(|v| v["is_processing"] == false && v["cached_tokens"] == 0));
    assert_eq!(before[1]["id"], 1);
    let ask = json!({"prompt": PROMPT, "n_predict": 8, "temperature": 0});
    let first = post(&s.addr, "/completion", &ask);
    assert_eq!(first.status, 200, "{}", first.body);
    let after = list(&s);
    let used = after.iter().position(|v| v["cached_tokens"] != 0).unwrap();
    let other = 1 - used;
    let action = |id: usize, what: &str, body: Value| {
        post(&s.addr, &format!("/slots/{id}?action={what}"), &body)
    };
    let saved = action(used, "save", json!({"filename": "conv.bin"}));
    assert_eq!(saved.status, 200, "{}", saved.body);
    let n_saved = saved.json()["n_saved"].as_u64().unwrap();
    assert!(
        n_saved > 0 && dir.path().join("conv.bin").exists(),
        "{}",
        saved.body
    );
    let erased = action(used, "erase", json!({}));
    assert_eq!(
        erased.json()["n_erased"].as_u64().unwrap(),
        after[used]["cached_tokens"].as_u64().unwrap()
    );
    assert!(list(&s).iter().all(|v| v["cached_tokens"] == 0));
    let restored = action(other, "restore", json!({"filename": "conv.bin"}));
    assert_eq!(restored.status, 200, "{}", restored.body);
    assert_eq!(restored.json()["n_restored"].as_u64().unwrap(), n_saved);
    assert_eq!(list(&s)[other]["cached_tokens"].as_u64().unwrap(), n_saved);
    // The same request again: the restored slot's cache serves its prompt, the same answer.
    let again = post(&s.addr, "/completion", &ask);
    assert_eq!(again.json()["content"], first.json()["content"]);
    assert!(
        again.json()["tokens_cached"].as_u64().unwrap() > 0,
        "{}",
        again.body
    );
    // Refusals, each naming what is wrong.
    std::fs::write(dir.path().join("junk.bin"), b"not a cache").unwrap();
    for (id, what, body, says) in [
        (
            0,
            "save",
            json!({"filename": "../escape"}),
            "plain file name",
        ),
        (0, "save", json!({}), "`filename`"),
        (
            0,
            "restore",
            json!({"filename": "missing.bin"}),
            "cannot read",
        ),
        (
            0,
            "restore",
            json!({"filename": "junk.bin"}),
            "not a slot file",
        ),
        (0, "rewind", json!({}), "save, restore or erase"),
        (7, "erase", json!({}), "no slot"),
    ] {
        let r = action(id, what, body);
        assert_eq!(r.status, 400, "{what}: {}", r.body);
        assert!(r.body.contains(says), "{what}: {}", r.body);
    }
    let cut = std::fs::read(dir.path().join("conv.bin")).unwrap();
    std::fs::write(dir.path().join("cut.bin"), &cut[..cut.len() / 2]).unwrap();
    let r = action(0, "restore", json!({"filename": "cut.bin"}));
    assert_eq!(r.status, 400, "{}", r.body);
    // Without a folder, save and restore say which option they need.
    let bare = Server::start(&[]);
    let r = post(
        &bare.addr,
        "/slots/0?action=save",
        &json!({"filename": "x"}),
    );
    assert_eq!(r.status, 501, "{}", r.body);
    assert!(r.body.contains("--slot-save-path"), "{}", r.body);
}

/// llama-server's `chat_template_kwargs` reach the chat template (as `/apply-template` shows); a
/// variable the render sets itself is refused by name.
#[test]
fn chat_template_kwargs_reach_the_template() {
    let s = Server::start(&[]);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let plain = post(&s.addr, "/apply-template", &json!({"messages": msgs}));
    assert_eq!(plain.status, 200, "{}", plain.body);
    let with = post(
        &s.addr,
        "/apply-template",
        &json!({"messages": msgs, "chat_template_kwargs": {"enable_thinking": false}}),
    );
    assert_eq!(with.status, 200, "{}", with.body);
    // SmolLM2's template reads no such variable: the same prompt.
    assert_eq!(with.json()["prompt"], plain.json()["prompt"]);
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": false}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "chat_template_kwargs": {"messages": []}}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("chat_template_kwargs"), "{}", r.body);
}

/// A trailing assistant message is continued (llama-server's prefill), as is the last message
/// with `continue_final_message`; `add_generation_prompt: false` leaves the assistant's turn
/// unopened; contradictions are refused by name.
#[test]
fn a_trailing_assistant_message_is_continued() {
    let s = Server::start(&["--chat-template", "chatml"]);
    let template = |body: Value| {
        let r = post(&s.addr, "/apply-template", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["prompt"].as_str().unwrap().to_string()
    };
    let user = json!({"role": "user", "content": "Name a colour."});
    let opened = "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(template(json!({"messages": [user]})), opened);
    let prefilled = json!([user, {"role": "assistant", "content": "My favourite is"}]);
    let want = format!("{opened}My favourite is");
    assert_eq!(template(json!({"messages": prefilled})), want);
    assert_eq!(
        template(json!({"messages": [user], "add_generation_prompt": false})),
        "<|im_start|>user\nName a colour.<|im_end|>\n"
    );
    assert_eq!(
        template(
            json!({"messages": [user, {"role": "user", "content": "Sure:"}], "continue_final_message": true})
        ),
        format!("{opened}Sure:")
    );
    // The answer goes on from the prefill: its prompt is that text, and the continuation is
    // what `/completion` gives for it.
    let chat = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": prefilled, "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(chat.status, 200, "{}", chat.body);
    let native = post(
        &s.addr,
        "/completion",
        &json!({"prompt": want, "n_predict": 6, "temperature": 0}),
    );
    assert_eq!(
        chat.json()["choices"][0]["message"]["content"],
        native.json()["content"],
        "{}",
        chat.body
    );
    assert_eq!(
        chat.json()["usage"]["prompt_tokens"],
        native.json()["tokens_evaluated"]
    );
    for (body, needle) in [
        (
            json!({"messages": [user, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}),
            "two or more assistant messages",
        ),
        (
            json!({"messages": prefilled, "continue_final_message": true, "add_generation_prompt": true}),
            "cannot both be true",
        ),
        (
            json!({"messages": prefilled, "continue_final_message": "reasoning_content"}),
            "continue_final_message",
        ),
    ] {
        let r = post(&s.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains(needle), "{}", r.body);
    }
}

/// llama-server's `/v1/chat/completions/input_tokens` counts a chat request's prompt as the
/// chat route reads it (template, system message and all) without running the model; a
/// malformed request is refused as the chat route refuses it.
#[test]
fn chat_input_tokens_count_the_prompt_the_chat_route_reads() {
    let s = Server::start(&[]);
    let body = json!({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."}
    ]});
    let r = post(&s.addr, "/v1/chat/completions/input_tokens", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["object"], "response.input_tokens");
    let n = r.json()["input_tokens"].as_u64().unwrap();
    let mut run = body.clone();
    run["max_tokens"] = 1.into();
    let c = post(&s.addr, "/v1/chat/completions", &run);
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(c.json()["usage"]["prompt_tokens"].as_u64(), Some(n));
    let r = post(
        &s.addr,
        "/chat/completions/input_tokens",
        &json!({"messages": "hi"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("messages"), "{}", r.body);
}

/// `n` choices: choice i is the answer a one-choice request with seed + i gets, every choice's
/// tokens are counted; streamed, more than one choice is refused by name.
#[test]
fn n_choices_sample_with_consecutive_seeds() {
    let s = Server::start(&[]);
    let ask = |route: &str, extra: Value| {
        let mut body = json!({"max_tokens": 12, "temperature": 1.0, "seed": 7});
        match route {
            "/v1/chat/completions" => {
                body["messages"] = json!([{"role": "user", "content": "Tell me a story."}])
            }
            _ => body["prompt"] = "Once upon a time".into(),
        }
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(&s.addr, route, &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    for (route, text) in [
        ("/v1/chat/completions", "/message/content"),
        ("/v1/completions", "/text"),
    ] {
        let many = ask(route, json!({"n": 3}));
        let choices = many["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3, "{many}");
        let mut tokens = 0;
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], i, "{many}");
            let one = ask(route, json!({"seed": 7 + i}));
            assert_eq!(
                c.pointer(text),
                one["choices"][0].pointer(text),
                "{route} choice {i}"
            );
            tokens += one["usage"]["completion_tokens"].as_u64().unwrap();
        }
        assert_eq!(many["usage"]["completion_tokens"].as_u64(), Some(tokens));
        let prompt = many["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(
            many["usage"]["total_tokens"].as_u64(),
            Some(prompt + tokens)
        );
    }
    let r = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "hi", "n": 2, "stream": true}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("`n`"), "{}", r.body);
}

/// OpenAI's list of prompts on `/v1/completions`: one answer each, in order (with `n`, each
/// prompt's choices in a row), each the answer its prompt alone gets, every prompt's and
/// answer's tokens counted; `echo` starts each with its own prompt; streamed, refused by name.
#[test]
fn a_list_of_prompts_gets_an_answer_each() {
    let s = Server::start(&[]);
    let prompts = ["The capital of France is", "One, two, three,"];
    let ask = |body: Value| {
        let r = post(&s.addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let alone: Vec<Value> = prompts
        .iter()
        .map(|p| ask(json!({"prompt": p, "max_tokens": 6, "temperature": 0})))
        .collect();
    let both = ask(json!({"prompt": prompts, "max_tokens": 6, "temperature": 0, "n": 2}));
    let choices = both["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4, "{both}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], alone[i / 2]["choices"][0]["text"], "{both}");
    }
    let sum = |key: &str| {
        alone
            .iter()
            .map(|a| a["usage"][key].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(
        both["usage"]["prompt_tokens"].as_u64(),
        Some(sum("prompt_tokens"))
    );
    assert_eq!(
        both["usage"]["completion_tokens"].as_u64(),
        Some(2 * sum("completion_tokens"))
    );
    let echoed = ask(json!({"prompt": prompts, "max_tokens": 2, "temperature": 0, "echo": true}));
    for (c, p) in echoed["choices"].as_array().unwrap().iter().zip(prompts) {
        assert!(c["text"].as_str().unwrap().starts_with(p), "{echoed}");
    }
    let r = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": prompts, "stream": true}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("`prompt`"), "{}", r.body);
}

/// A thinking model's reasoning comes apart from its answer (llama-server's
/// `reasoning_format`, `auto` by default), whole and streamed as `reasoning_content` deltas; an
/// answer is made to think here by a grammar (the test model does not think on its own).
#[test]
fn reasoning_comes_apart_from_the_answer() {
    let s = Server::start(&[]);
    let think = r#"root ::= "<think>Two and two.</think>\n\nFour.""#;
    let body = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "2 + 2?"}], "max_tokens": 64,
                           "temperature": 0, "grammar": think});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let r = post(&s.addr, "/v1/chat/completions", &body(json!({})));
    assert_eq!(r.status, 200, "{}", r.body);
    let m = &r.json()["choices"][0]["message"];
    assert_eq!(m["content"], "Four.", "{}", r.body);
    assert_eq!(m["reasoning_content"], "Two and two.", "{}", r.body);
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &body(json!({"reasoning_format": "none"})),
    );
    let m = &r.json()["choices"][0]["message"];
    assert_eq!(
        m["content"], "<think>Two and two.</think>\n\nFour.",
        "{}",
        r.body
    );
    assert!(m.get("reasoning_content").is_none(), "{}", r.body);
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &body(json!({"stream": true})),
    );
    assert_eq!(r.status, 200);
    let (_, field) = chat_stream(&r.body);
    assert_eq!(field("reasoning_content"), "Two and two.");
    assert_eq!(field("content"), "Four.");
    let r = post(
        &s.addr,
        "/v1/chat/completions",
        &body(json!({"reasoning_format": "hidden"})),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("reasoning_format"), "{}", r.body);
}

/// OpenAI's `reasoning_effort` reaches the chat template as llama-server gives it (gpt-oss's
/// template reads `reasoning_effort`); `none` turns thinking off (`enable_thinking: false`,
/// Qwen3's); another value is refused by name.
#[test]
fn reasoning_effort_reaches_the_template() {
    let template = "{{ reasoning_effort | default('-') }}/{{ enable_thinking | default('-') }}/{% for m in messages %}{{ m.content }}{% endfor %}";
    let s = Server::start(&["--chat-template", template]);
    let render = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(&s.addr, "/apply-template", &body);
        (r.status, r.body)
    };
    let prompt = |extra: Value| {
        let (status, body) = render(extra);
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["prompt"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(prompt(json!({})), "-/-/hi");
    assert_eq!(prompt(json!({"reasoning_effort": "high"})), "high/-/hi");
    assert_eq!(prompt(json!({"reasoning_effort": "none"})), "-/False/hi");
    let (status, body) = render(json!({"reasoning_effort": "extreme"}));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("reasoning_effort"), "{body}");
}

/// `/v1/embeddings` takes llama-server's input forms too: text and token ids mixed in one
/// input, `{"prompt_string"}` and `{"content": [text parts]}` objects, lists of any of them;
/// the same text gives the same vector in every form.
#[test]
fn embeddings_take_llama_servers_input_forms() {
    let s = Server::start(&[]);
    let embed = |input: Value| post(&s.addr, "/v1/embeddings", &json!({ "input": input }));
    let vectors = |input: Value| -> Vec<Value> {
        let r = embed(input.clone());
        assert_eq!(r.status, 200, "{input}: {}", r.body);
        let data = r.json()["data"].as_array().unwrap().clone();
        data.iter().map(|d| d["embedding"].clone()).collect()
    };
    assert_eq!(vectors(json!("hello world")).len(), 1);
    assert_eq!(vectors(json!([12, 34, "hello", 56])).len(), 1);
    assert_eq!(vectors(json!(["a", [12, 34, 56]])).len(), 2);
    let same = vectors(json!([
        "hello world",
        {"prompt_string": "hello world"},
        {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
    ]));
    assert_eq!(same.len(), 3);
    assert!(same[1] == same[0] && same[2] == same[0]);
    for bad in [
        json!({"content": "text"}),
        json!({"content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
        json!([[]]),
        json!([[[1]]]),
        json!(null),
        json!([1, 1e30]),
    ] {
        let r = embed(bad.clone());
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert!(r.body.contains("input"), "{bad}: {}", r.body);
    }
}
