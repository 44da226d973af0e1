//! Several sequences on one engine: a batched step gives each sequence its own one-token
//! step's logits, bit for bit (in memory and under a memory budget); sequences decoding at
//! once from their own threads are batched and keep plain decode's tokens; KV caches that
//! outgrow the budget end in a clear error, never a process over it.

mod common;

use pi2_engine::{
    generate_drafted, Decoder, Engine, EngineConfig, GenerateConfig, Logits, Offload,
    OffloadConfig, Sampler, SamplerConfig, SharedEngine, SparseFfn,
};
use pi2_model::synth::SynthSpec;
use pi2_model::{Model, TokenId};

fn spec() -> SynthSpec {
    common::offload_spec()
}

fn cfg() -> EngineConfig {
    common::offload_cfg(96)
}

const PROMPTS: [&[TokenId]; 3] = [&[5, 17, 42, 3], &[9, 9, 120, 64, 31, 2], &[77]];

/// A memory budget over `m` (converted, at `path`) of its least plus `extra` bytes.
fn budget_offload(m: &Model, sp: &SparseFfn<'_>, path: &std::path::Path, extra: u64) -> Offload {
    let (kv, scratch) = (
        pi2_engine::kv_bytes_start(m, &cfg(), 8) as u64,
        pi2_engine::scratch_bytes(m, &cfg(), 8) as u64,
    );
    let least = pi2_engine::min_budget(m, sp, kv, scratch).unwrap();
    let oc = OffloadConfig {
        budget: least + extra,
        hot_share: 0.5,
        ..Default::default()
    };
    let freq = common::frequencies(m);
    Offload::new(m, sp, path, kv, scratch, freq.as_deref(), &oc).unwrap()
}

/// Each prompt alone: its prefill's logits, then greedy steps' logits.
fn alone(e: &mut Engine<'_>, prompt: &[TokenId], steps: usize) -> Vec<Vec<f32>> {
    e.truncate(0);
    let mut out = vec![e.forward(prompt, Logits::Last).unwrap().to_vec()];
    for _ in 0..steps {
        let t = pi2_engine::argmax(out.last().unwrap());
        out.push(e.forward(&[t], Logits::Last).unwrap().to_vec());
    }
    out
}

/// The prompts prefilled one by one on their own caches, then stepped together.
fn together(e: &mut Engine<'_>, steps: usize) -> Vec<Vec<Vec<f32>>> {
    let nv = e.model().config.n_vocab;
    let mut seqs: Vec<_> = PROMPTS.iter().map(|_| e.new_sequence()).collect();
    let mut out: Vec<Vec<Vec<f32>>> = Vec::new();
    for (seq, p) in seqs.iter_mut().zip(PROMPTS) {
        e.swap_sequence(seq);
        out.push(vec![e.forward(p, Logits::Last).unwrap().to_vec()]);
        e.swap_sequence(seq);
    }
    for _ in 0..steps {
        let tokens: Vec<TokenId> = out
            .iter()
            .map(|o| pi2_engine::argmax(o.last().unwrap()))
            .collect();
        let mut refs: Vec<_> = seqs.iter_mut().collect();
        let rows = e.forward_sequences(&mut refs, &tokens).unwrap().to_vec();
        for (k, o) in out.iter_mut().enumerate() {
            o.push(rows[k * nv..(k + 1) * nv].to_vec());
        }
    }
    for (seq, p) in seqs.iter().zip(PROMPTS) {
        assert_eq!(seq.len(), p.len() + steps);
    }
    out
}

#[test]
fn a_batched_step_is_each_sequences_own_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::converted_model(dir.path(), &spec(), &cfg(), true);
    let m = Model::load(&path).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    let steps = 10;
    let mut reference = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
    let want: Vec<_> = PROMPTS
        .iter()
        .map(|p| alone(&mut reference, p, steps))
        .collect();
    // In memory, dense; in memory, sparse; under a tight budget and a roomy one.
    let mut dense = Engine::new(&m, &cfg()).unwrap();
    let dense_want: Vec<_> = PROMPTS
        .iter()
        .map(|p| alone(&mut dense, p, steps))
        .collect();
    for (want, got) in dense_want.iter().zip(together(&mut dense, steps)) {
        common::assert_same_logits(want, &got, "dense");
    }
    let mut sparse = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
    for (want, got) in want.iter().zip(together(&mut sparse, steps)) {
        common::assert_same_logits(want, &got, "sparse");
    }
    let file = m.file.file_size();
    for extra in [64 << 10, file] {
        let o = budget_offload(&m, &sp, &path, extra);
        let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap();
        for (want, got) in want.iter().zip(together(&mut e, steps)) {
            common::assert_same_logits(want, &got, &format!("budget +{extra}"));
        }
        let o = e.offload().unwrap();
        assert!(o.budget().total_used() <= o.budget().limit());
        // Every sequence's cache is charged, not only the engine's own.
        let held: u64 = PROMPTS.len() as u64 * e.new_sequence().bytes() as u64;
        assert!(o.kv_charged() >= held, "{} < {held}", o.kv_charged());
    }
    // Mismatched inputs are refused.
    let mut s = sparse.new_sequence();
    let err = sparse
        .forward_sequences(&mut [&mut s], &[1, 2])
        .unwrap_err();
    assert!(err.to_string().contains("one token each"), "{err}");
}

/// Three threads decode at once on one engine under a budget: each gets plain decode's
/// greedy tokens, and steps were batched.
#[test]
fn sequences_on_threads_are_batched_and_keep_their_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::converted_model(dir.path(), &spec(), &cfg(), true);
    let m = Model::load(&path).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    let n = 24;
    let generate = |d: &mut dyn Decoder<'_>, prompt: &[TokenId]| {
        let mut sampler = Sampler::new(SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        });
        let g = GenerateConfig {
            max_tokens: Some(n),
            ignore_eos: true,
            n_batch: 8,
            ..Default::default()
        };
        generate_drafted(d, &mut sampler, &mut Vec::new(), prompt, &g, None, |_| true)
            .unwrap()
            .tokens
    };
    let mut plain = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
    let want: Vec<_> = PROMPTS
        .iter()
        .map(|p| {
            plain.truncate(0);
            generate(&mut plain, p)
        })
        .collect();
    let o = budget_offload(&m, &sp, &path, 256 << 10);
    let shared = SharedEngine::new(common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap());
    let got: Vec<Vec<TokenId>> = std::thread::scope(|scope| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let mut seq = shared.sequence();
                let generate = &generate;
                scope.spawn(move || {
                    let t = generate(&mut seq, p);
                    seq.idle();
                    t
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want);
    let stats = shared.batch_stats();
    assert!(stats.tokens > stats.steps, "no step was batched: {stats:?}");
    shared.with_engine(|e| {
        let b = e.offload().unwrap().budget();
        assert!(b.total_used() <= b.limit());
    });
}

/// Sequences whose caches outgrow the least budget fail their step saying the budget is full.
#[test]
fn caches_beyond_the_budget_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = common::converted_model(dir.path(), &spec(), &cfg(), true);
    let m = Model::load(&path).unwrap();
    let (sp, _) = pi2_engine::load_sparse(&m).unwrap().unwrap();
    let o = budget_offload(&m, &sp, &path, 0);
    let mut e = common::sparse_engine(&m, &cfg(), &sp, Some(o)).unwrap();
    let mut seqs: Vec<_> = (0..6).map(|_| e.new_sequence()).collect();
    let err = (0..90)
        .find_map(|i| {
            let mut refs: Vec<_> = seqs.iter_mut().collect();
            let tokens = vec![(i % 50) as TokenId; refs.len()];
            e.forward_sequences(&mut refs, &tokens).err()
        })
        .expect("six growing caches outgrow the least budget");
    assert!(
        matches!(err, pi2_engine::EngineError::MemoryFull(_)),
        "{err}"
    );
    let b = e.offload().unwrap().budget();
    assert!(b.total_used() <= b.limit());
}

/// A prompt whose start is cached (a conversation's next turn, a repeated request) ends as it
/// does fresh: its last token is evaluated as a prompt, not as a sparse decode step. (The
/// server's tests see the text stay the same on a real model.)
#[test]
fn a_prompts_lone_last_token_runs_as_a_prompt() {
    let m = Model::from_file(
        pi2_model::GgufFile::from_bytes(&pi2_model::synth::build(&spec()).to_bytes()).unwrap(),
    )
    .unwrap();
    // Firing thresholds high enough that a sparse step differs from the dense prompt pass.
    let sp = SparseFfn::from_dense(&m, &[0.5, 0.5], None).unwrap();
    let mut e = common::sparse_engine(&m, &cfg(), &sp, None).unwrap();
    let p = PROMPTS[1];
    let whole = e.forward(p, Logits::Last).unwrap().to_vec();
    let last = &p[p.len() - 1..];
    e.truncate(p.len() - 1);
    let step = e.forward(last, Logits::Last).unwrap().to_vec();
    e.truncate(p.len() - 1);
    let prompt = e.forward_prompt(last).unwrap().to_vec();
    assert!(
        common::max_rel_diff(&whole, &step) > 1e-3,
        "the sparse step is dense"
    );
    assert!(common::max_rel_diff(&whole, &prompt) < 1e-5);
}
