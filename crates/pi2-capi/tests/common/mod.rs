//! What the C API tests share: the test model, opening it, a session, and generation into a
//! String through the text callback.
#![allow(dead_code)]

use pi2_capi::*;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;
use std::ptr::{null, null_mut};

pub fn smollm2() -> CString {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "test model missing at {}: run `cargo xtask fetch-model` first",
        path.display()
    );
    CString::new(path.to_str().unwrap()).unwrap()
}

pub fn last_error() -> String {
    // SAFETY: pi2_last_error never returns NULL and its string lives until the next call.
    unsafe { CStr::from_ptr(pi2_last_error()) }
        .to_string_lossy()
        .into_owned()
}

pub fn open(path: &CString, opts: Option<&pi2_model_options>) -> *mut pi2_model {
    let mut m = null_mut();
    let o = opts.map_or(null(), |o| o as *const _);
    // SAFETY: valid strings and out-pointer.
    let st = unsafe { pi2_model_open(path.as_ptr(), o, &mut m) };
    assert_eq!(st, pi2_status::PI2_OK, "{}", last_error());
    m
}

pub fn session(m: *mut pi2_model) -> *mut pi2_session {
    let mut s = null_mut();
    // SAFETY: a valid out-pointer.
    let st = unsafe { pi2_session_new(m, &mut s) };
    assert_eq!(st, pi2_status::PI2_OK, "{}", last_error());
    s
}

pub unsafe extern "C" fn collect(t: *const c_char, len: usize, user: *mut c_void) -> bool {
    // SAFETY: `user` is the String the test passes, `t` holds `len` bytes.
    unsafe {
        let s = &mut *user.cast::<String>();
        let bytes = std::slice::from_raw_parts(t.cast::<u8>(), len);
        s.push_str(std::str::from_utf8(bytes).unwrap());
        assert_eq!(*t.add(len), 0, "the text is NUL-terminated");
    }
    true
}

pub fn generate(
    s: *mut pi2_session,
    prompt: &str,
    o: &pi2_generate_options,
) -> (pi2_status, String) {
    let p = CString::new(prompt).unwrap();
    let mut text = String::new();
    // SAFETY: valid strings, options and callback data.
    let st = unsafe {
        pi2_generate(
            s,
            p.as_ptr(),
            o,
            Some(collect),
            (&mut text as *mut String).cast(),
        )
    };
    (st, text)
}
