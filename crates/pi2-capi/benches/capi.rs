//! The C API's own cost: a greedy generation of 16 tokens on a small synthetic model through
//! `pi2_generate` (with a text callback) against the runtime's session directly.

use criterion::{criterion_group, criterion_main, Criterion};
use pi2_capi::*;
use pi2_runtime::handle::{LoadedModel, Session, TextRequest};
use std::ffi::{c_char, c_void, CString};

unsafe extern "C" fn count(_t: *const c_char, len: usize, user: *mut c_void) -> bool {
    // SAFETY: `user` is the `usize` the bench passes.
    unsafe { *user.cast::<usize>() += len };
    true
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let spec = ::pi2_model::synth::SynthSpec {
        n_embd: 256,
        n_ff: 1024,
        n_layer: 4,
        ..Default::default()
    };
    std::fs::write(&path, ::pi2_model::synth::build(&spec).to_bytes()).unwrap();
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let mut opts = pi2_generate_options_default();
    opts.temperature = 0.0;
    opts.max_tokens = 16;
    opts.ignore_eos = true;
    let prompt = CString::new("hello world").unwrap();
    let mut g = c.benchmark_group("generate_16");
    unsafe {
        let mut m = std::ptr::null_mut();
        assert_eq!(
            pi2_model_open(cpath.as_ptr(), std::ptr::null(), &mut m),
            pi2_status::PI2_OK
        );
        let mut s = std::ptr::null_mut();
        assert_eq!(pi2_session_new(m, &mut s), pi2_status::PI2_OK);
        g.bench_function("c_api", |b| {
            b.iter(|| {
                let mut n = 0usize;
                let st = pi2_generate(
                    s,
                    prompt.as_ptr(),
                    &opts,
                    Some(count),
                    (&mut n as *mut usize).cast(),
                );
                assert_eq!(st, pi2_status::PI2_OK);
                pi2_session_reset(s);
            })
        });
        pi2_session_free(s);
        pi2_model_free(m);
    }
    let lm = LoadedModel::open(Some(&path), &Default::default(), &mut |_| {}).unwrap();
    let mut s = Session::new(lm.clone()).unwrap();
    let ids = lm.model().tokenizer.encode("hello world", true, true);
    let req = TextRequest {
        sampler: pi2_engine::SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        },
        max_tokens: Some(16),
        ignore_eos: true,
        ..Default::default()
    };
    g.bench_function("runtime", |b| {
        b.iter(|| {
            s.generate(&ids, &req, &mut |_| true).unwrap();
            s.reset();
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
