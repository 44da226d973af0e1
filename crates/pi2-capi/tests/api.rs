//! The C API called as C would call it: generation equal to the runtime's, tokenize and chat
//! templates on the real test model, and bad input of every kind (NULL pointers, closed and
//! wrong handles, bad text, small buffers, absurd options, a budget too small, a session used
//! from two threads) answered with a status and a message, never a crash.

mod common;

use common::*;
use pi2_capi::*;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};

unsafe extern "C" fn stop_at_once(_: *const c_char, _: usize, user: *mut c_void) -> bool {
    // SAFETY: `user` is the counter the test passes.
    unsafe { *user.cast::<usize>() += 1 };
    false
}

fn greedy(n: i32) -> pi2_generate_options {
    let mut o = pi2_generate_options_default();
    o.temperature = 0.0;
    o.max_tokens = n;
    o
}

#[test]
fn generates_the_runtimes_text_and_counts_it() {
    let path = smollm2();
    let m = open(&path, None);
    let s = session(m);
    let (st, text) = generate(s, "The capital of France is", &greedy(16));
    assert_eq!(st, pi2_status::PI2_OK, "{}", last_error());
    // The runtime's session on the same file says the same.
    let lm = pi2_runtime::handle::LoadedModel::open(
        Some(std::path::Path::new(path.to_str().unwrap())),
        &Default::default(),
        &mut |_| {},
    )
    .unwrap();
    let mut rs = pi2_runtime::handle::Session::new(lm.clone()).unwrap();
    let ids = lm
        .model()
        .tokenizer
        .encode("The capital of France is", true, true);
    let mut want = String::new();
    let req = pi2_runtime::handle::TextRequest {
        sampler: pi2_engine::SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        },
        max_tokens: Some(16),
        ..Default::default()
    };
    rs.generate(&ids, &req, &mut |t| {
        want.push_str(t);
        true
    })
    .unwrap();
    assert_eq!(text, want);
    let mut stats = std::mem::MaybeUninit::<pi2_stats>::uninit();
    // SAFETY: a valid out-pointer.
    assert_eq!(
        unsafe { pi2_session_stats(s, stats.as_mut_ptr()) },
        pi2_status::PI2_OK
    );
    // SAFETY: written by the call above.
    let stats = unsafe { stats.assume_init() };
    assert!(stats.generated_tokens > 0 && stats.generated_tokens <= 16);
    assert!(stats.tokens_per_second > 0.0);
    assert_eq!(stats.bytes_read_per_token, 0.0);
    assert!(stats.peak_rss_bytes > 0);
    // A callback's false cancels after its first piece.
    let mut calls = 0usize;
    let p = CString::new("Once upon a time").unwrap();
    // SAFETY: valid arguments.
    let st = unsafe {
        pi2_generate(
            s,
            p.as_ptr(),
            &greedy(16),
            Some(stop_at_once),
            (&mut calls as *mut usize).cast(),
        )
    };
    assert_eq!((st, calls), (pi2_status::PI2_OK, 1));
    let mut stats = std::mem::MaybeUninit::<pi2_stats>::uninit();
    // SAFETY: a valid out-pointer; written by the call.
    let stats = unsafe {
        pi2_session_stats(s, stats.as_mut_ptr());
        stats.assume_init()
    };
    assert_eq!(stats.finish, pi2_finish::PI2_FINISH_CANCELLED);
    // Stop strings end the text before them.
    let stop = CString::new(" of").unwrap();
    let stops = [stop.as_ptr()];
    let mut o = greedy(16);
    o.stops = stops.as_ptr();
    o.n_stops = 1;
    let (st, cut) = generate(s, "The capital of France is", &o);
    assert_eq!(st, pi2_status::PI2_OK);
    assert!(
        text.starts_with(&cut) && !cut.contains(" of"),
        "{cut:?} of {text:?}"
    );
    assert_eq!(pi2_session_free(s), pi2_status::PI2_OK);
    assert_eq!(pi2_model_free(m), pi2_status::PI2_OK);
}

#[test]
fn tokenize_detokenize_and_chat_templates() {
    let m = open(&smollm2(), None);
    let text = CString::new("Hello, world").unwrap();
    let mut n = 0usize;
    // Asking for the count first: too small a buffer says how many.
    // SAFETY: valid arguments (no buffer).
    let st = unsafe { pi2_tokenize(m, text.as_ptr(), false, false, null_mut(), 0, &mut n) };
    assert_eq!(st, pi2_status::PI2_ERR_BUFFER_TOO_SMALL);
    assert!(n > 1);
    let mut ids = vec![0u32; n];
    // SAFETY: room for `n` ids.
    let st = unsafe { pi2_tokenize(m, text.as_ptr(), false, false, ids.as_mut_ptr(), n, &mut n) };
    assert_eq!(st, pi2_status::PI2_OK);
    let mut buf = vec![0 as c_char; 64];
    let mut len = 0usize;
    // SAFETY: valid buffers.
    let st = unsafe { pi2_detokenize(m, ids.as_ptr(), n, buf.as_mut_ptr(), buf.len(), &mut len) };
    assert_eq!(st, pi2_status::PI2_OK);
    // SAFETY: NUL-terminated by the call.
    assert_eq!(
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(),
        "Hello, world"
    );
    assert_eq!(len, 12);
    // A token outside the vocabulary is refused by position.
    let bad = [ids[0], u32::MAX];
    // SAFETY: valid buffers.
    let st = unsafe { pi2_detokenize(m, bad.as_ptr(), 2, buf.as_mut_ptr(), buf.len(), &mut len) };
    assert_eq!(st, pi2_status::PI2_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("tokens[1]"), "{}", last_error());
    // The chat template, as the CLI renders it.
    let (role, content) = (CString::new("user").unwrap(), CString::new("Hi").unwrap());
    let msgs = [pi2_message {
        role: role.as_ptr(),
        content: content.as_ptr(),
    }];
    let mut out = vec![0 as c_char; 4096];
    // SAFETY: valid messages and buffer.
    let st = unsafe {
        pi2_chat_apply(
            m,
            msgs.as_ptr(),
            1,
            true,
            out.as_mut_ptr(),
            out.len(),
            &mut len,
        )
    };
    assert_eq!(st, pi2_status::PI2_OK, "{}", last_error());
    // SAFETY: NUL-terminated by the call.
    let rendered = unsafe { CStr::from_ptr(out.as_ptr()) }.to_str().unwrap();
    assert!(
        rendered.contains("<|im_start|>user\nHi<|im_end|>")
            && rendered.ends_with("<|im_start|>assistant\n"),
        "{rendered}"
    );
    // A made-up role is refused by name.
    let odd = CString::new("wizard").unwrap();
    let msgs = [pi2_message {
        role: odd.as_ptr(),
        content: content.as_ptr(),
    }];
    // SAFETY: valid messages and buffer.
    let st = unsafe {
        pi2_chat_apply(
            m,
            msgs.as_ptr(),
            1,
            true,
            out.as_mut_ptr(),
            out.len(),
            &mut len,
        )
    };
    assert_eq!(st, pi2_status::PI2_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("messages[0].role"),
        "{}",
        last_error()
    );
    pi2_model_free(m);
}

#[test]
fn bad_input_gets_a_status_and_a_message_never_a_crash() {
    use pi2_status::*;
    let path = smollm2();
    let mut m = null_mut();
    let mut s = null_mut();
    // NULL out-pointers and arguments.
    // SAFETY (this whole test): the API's contract allows NULL where tested; other pointers
    // are valid.
    unsafe {
        assert_eq!(
            pi2_model_open(path.as_ptr(), null(), null_mut()),
            PI2_ERR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("out_model is NULL"),
            "{}",
            last_error()
        );
        assert_eq!(
            pi2_session_new(null_mut(), &mut s),
            PI2_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("model handle is NULL"));
        // A missing file, text that is not UTF-8.
        let missing = CString::new("/nonexistent/model.gguf").unwrap();
        assert_ne!(pi2_model_open(missing.as_ptr(), null(), &mut m), PI2_OK);
        assert!(m.is_null());
        assert!(last_error().contains("model.gguf"), "{}", last_error());
        let latin1 = CString::new(vec![0xe9u8, 0x41]).unwrap();
        assert_eq!(
            pi2_model_open(latin1.as_ptr(), null(), &mut m),
            PI2_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("not UTF-8"));
        // Absurd options name themselves.
        let mut o = pi2_model_options_default();
        o.n_ctx = u32::MAX;
        assert_eq!(
            pi2_model_open(path.as_ptr(), &o, &mut m),
            PI2_ERR_OPTION,
            "{}",
            last_error()
        );
        let lots = CString::new("lots").unwrap();
        let mut o = pi2_model_options_default();
        o.mem_budget = lots.as_ptr();
        assert_eq!(pi2_model_open(path.as_ptr(), &o, &mut m), PI2_ERR_OPTION);
        assert!(last_error().contains("--mem-budget"), "{}", last_error());
        // A budget too small says what it needs.
        let tiny = CString::new("1M").unwrap();
        o.mem_budget = tiny.as_ptr();
        assert_eq!(pi2_model_open(path.as_ptr(), &o, &mut m), PI2_ERR_OPTION);
        assert!(last_error().contains("too small"), "{}", last_error());

        let m = open(&path, None);
        let s = session(m);
        // Wrong types: a session handle where a model goes, and the reverse.
        let mut n = 0usize;
        let hi = CString::new("hi").unwrap();
        assert_eq!(
            pi2_tokenize(
                s as *const pi2_model,
                hi.as_ptr(),
                true,
                true,
                null_mut(),
                0,
                &mut n
            ),
            PI2_ERR_INVALID_HANDLE
        );
        assert_eq!(
            pi2_session_reset(m as *mut pi2_session),
            PI2_ERR_INVALID_HANDLE
        );
        // Made-up handles.
        assert_eq!(
            pi2_model_free(0xdead as *mut pi2_model),
            PI2_ERR_INVALID_HANDLE
        );
        // NULL prompt, NULL stops with a count, bad numbers.
        assert_eq!(
            pi2_generate(s, null(), null(), None, null_mut()),
            PI2_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("prompt is NULL"));
        let mut o = greedy(4);
        o.n_stops = 2;
        assert_eq!(generate(s, "hi", &o).0, PI2_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("stops is NULL"));
        let mut o = greedy(4);
        o.temperature = f32::NAN;
        assert_eq!(generate(s, "hi", &o).0, PI2_ERR_OPTION);
        assert!(last_error().contains("temperature"), "{}", last_error());
        assert_eq!(generate(s, "hi", &greedy(-5)).0, PI2_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("max_tokens"));
        // An empty prompt (this model adds no BOS) is refused by name.
        assert_eq!(generate(s, "", &greedy(2)).0, PI2_ERR_OPTION);
        assert!(
            last_error().contains("prompt: has no tokens"),
            "{}",
            last_error()
        );
        // A closed model keeps its sessions working; closed handles are refused after.
        assert_eq!(pi2_model_free(m), PI2_OK);
        assert_eq!(pi2_model_free(m), PI2_ERR_INVALID_HANDLE);
        assert!(last_error().contains("closed"));
        assert_eq!(generate(s, "hi", &greedy(2)).0, PI2_OK);
        assert_eq!(pi2_session_free(s), PI2_OK);
        assert_eq!(pi2_session_free(s), PI2_ERR_INVALID_HANDLE);
        assert_eq!(generate(s, "hi", &greedy(2)).0, PI2_ERR_INVALID_HANDLE);
        assert_eq!(pi2_model_free(null_mut()), PI2_OK);
        assert_eq!(last_error(), "");
    }
}

static GATE: std::sync::Barrier = std::sync::Barrier::new(2);

unsafe extern "C" fn wait_for_other(_: *const c_char, _: usize, _: *mut c_void) -> bool {
    // Holds the session inside a generation until the other thread has tried it.
    GATE.wait();
    GATE.wait();
    false
}

#[test]
fn a_session_used_from_two_threads_is_busy_not_broken() {
    let m = open(&smollm2(), None);
    let s = session(m) as usize;
    let worker = std::thread::spawn(move || {
        let p = CString::new("Once upon a time").unwrap();
        // SAFETY: valid arguments.
        unsafe {
            pi2_generate(
                s as *mut pi2_session,
                p.as_ptr(),
                &greedy(8),
                Some(wait_for_other),
                null_mut(),
            )
        }
    });
    GATE.wait();
    let (st, _) = generate(s as *mut pi2_session, "hi", &greedy(2));
    assert_eq!(st, pi2_status::PI2_ERR_BUSY);
    assert!(last_error().contains("another thread"));
    GATE.wait();
    assert_eq!(worker.join().unwrap(), pi2_status::PI2_OK);
    assert_eq!(
        generate(s as *mut pi2_session, "hi", &greedy(2)).0,
        pi2_status::PI2_OK
    );
    pi2_session_free(s as *mut pi2_session);
    pi2_model_free(m);
}
