//! One forward pass: embed (or take a given residual stream) -> every layer (attention, FFN)
//! -> final norm and the output head. Every weight comes from the engine's store.

use super::{Engine, Input, Pass};
use crate::error::EngineError;
use crate::moe::RouterInput;
use crate::pipeline::Step;
use crate::residency::Mapped;
use crate::scratch::{grow, rms_norm_in_place, rms_norm_rows};
use crate::states::Keep;
use crate::weights::{SparseCall, Table};
use crate::{ffn, mixer, moe, per_layer};
use pi2_model::{LayerWeights, TokenId};
use pi2_sparse::FfnObserver;

impl Engine<'_> {
    pub(super) fn forward_inner<'o>(
        &mut self,
        input: Input<'_>,
        first_logit: usize,
        pass: Pass,
        mut observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        let n = input.len(c.n_embd);
        let pos0 = self.kv.len;
        // The KV cache grows inside a budget: room comes from the neuron memory.
        let (parked, parked_positions) = self.parked_kv;
        // A checked draft keeps a recurrent layer's state after each of its tokens.
        let keep = match pass {
            Pass::Decode => Keep::Each,
            _ => Keep::Last,
        };
        let kv = self.kv.bytes_at(pos0 + n, n, keep) + parked;
        self.store
            .charge_kv(kv as u64, pos0 + n + parked_positions)?;
        let (first_layer, resumed) = match input {
            Input::Tokens(tokens) => {
                self.embed(tokens)?;
                (0, false)
            }
            Input::Stream { layer, x, tokens } => {
                // Embedding gives the tokens' per-layer inputs where the model has them.
                if m.weights.per_layer.is_some() {
                    self.embed(tokens)?;
                }
                grow(&mut self.s.x, x.len()).copy_from_slice(x);
                (layer, true)
            }
        };
        self.s.rope.fill(&self.inv_freq, c.rope_mscale, pos0, n);
        if let Some(f) = &self.inv_freq_local {
            self.s.rope_local.fill(f, c.rope_mscale, pos0, n);
        }
        for (li, l) in m.weights.layers.iter().enumerate().skip(first_layer) {
            if let Some(o) = observer.as_deref_mut() {
                o.observe_stream(li, &self.s.x[..n * c.n_embd]);
            }
            self.route_before_attention(li, l, n, pass)?;
            let mats = self.store.attention(li)?;
            mixer::block(
                &self.ks,
                f,
                c,
                l,
                mats,
                &mut self.s,
                &mut self.kv,
                li,
                pos0,
                n,
                keep,
            );
            self.ffn_layer(li, l, n, pass, observer.as_deref_mut())?;
        }
        if resumed {
            // Sliding-window rings may have written over what the next positions attend to.
            self.kv.truncate(pos0);
        } else {
            self.kv.len = pos0 + n;
        }
        self.head(n, first_logit, observer)
    }

    /// Layer `li`'s routes from its input stream, where the model routes before attention.
    /// A decoded token's experts are then known one attention block early: a store that
    /// streams experts starts reading them now (the exact choice, not a guess), so the reads
    /// overlap attention.
    pub(super) fn route_before_attention(
        &mut self,
        li: usize,
        l: &LayerWeights,
        n: usize,
        pass: Pass,
    ) -> Result<(), EngineError> {
        let (c, f) = (&self.model.config, &self.model.file);
        let Some(router) = (moe::Router::of(l, f)).filter(|_| c.route_before_attention) else {
            return Ok(());
        };
        let (s, routes) = (&mut self.s, &mut self.routes);
        moe::route_tokens(&self.ks, c, li, &router, RouterInput::Stream, s, routes, n);
        if n == 1 && pass != Pass::Prompt && self.store.experts().is_some() {
            let units: Vec<usize> = (self.routes.picked.iter())
                .map(|&(e, _)| li * c.n_expert + e)
                .collect();
            self.store.prefetch(&units)?;
        }
        Ok(())
    }

    /// Embedding rows of `tokens` into `s.x`, scaled as the model says.
    pub(super) fn embed(&mut self, tokens: &[TokenId]) -> Result<(), EngineError> {
        let (c, f) = (&self.model.config, &self.model.file);
        let x = grow(&mut self.s.x, tokens.len() * c.n_embd);
        self.store.embed(Table::Embedding, tokens, x)?;
        if c.embd_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.embd_scale);
        }
        if let Some(p) = &self.model.weights.per_layer {
            let rows = grow(&mut self.s.per_layer, tokens.len() * p.token_embd.cols);
            self.store.embed(Table::PerLayer, tokens, rows)?;
            per_layer::inputs(&self.ks, f, c, p, tokens.len(), &mut self.s);
        }
        Ok(())
    }

    /// Final norm and LM head for the rows from `first_logit` on, into `s.logits`. An
    /// observer sees every row's normalized state.
    pub(super) fn head<'o>(
        &mut self,
        n: usize,
        first_logit: usize,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        let d = c.n_embd;
        let rows = n - first_logit;
        let s = &mut self.s;
        let normed = if observer.is_some() { 0 } else { first_logit };
        rms_norm_rows(
            &s.x[normed * d..],
            m.weights.output_norm.f32s(f),
            c.rms_eps,
            d,
            n - normed,
            &mut s.xn,
        );
        if let Some(o) = observer {
            o.observe_head(&s.xn[..n * d]);
            s.xn.copy_within(first_logit * d..n * d, 0);
        }
        let logits = grow(&mut s.logits, rows * c.n_vocab);
        let (kind, _) = self.store.output_kind();
        s.acts.quantize(kind, &s.xn[..rows * d], d);
        self.head.logits(
            &self.ks,
            self.store.as_mut(),
            &s.xn[..rows * d],
            &s.acts,
            rows,
            logits,
        )?;
        let logits = &mut self.s.logits[..rows * c.n_vocab];
        if c.logit_scale != 1.0 {
            let inv = c.logit_scale.recip();
            logits.iter_mut().for_each(|v| *v *= inv);
        }
        if let Some(cap) = c.final_softcap {
            let inv = cap.recip();
            logits.iter_mut().for_each(|v| *v = cap * (*v * inv).tanh());
        }
        Ok(())
    }

    /// Layer `li`'s FFN and what ends the layer after it (a per-layer input, an output scale).
    pub(super) fn ffn_layer<'o>(
        &mut self,
        li: usize,
        l: &LayerWeights,
        n: usize,
        pass: Pass,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        self.ffn_block(li, l, n, pass, observer)?;
        let (c, f) = (&self.model.config, &self.model.file);
        per_layer::finish_layer(&self.ks, f, c, l, li, n, &mut self.s);
        Ok(())
    }

    /// Layer `li`'s FFN on the normalised stream, its output (normalised again where the
    /// layer says so) added to the residual stream.
    fn ffn_block<'o>(
        &mut self,
        li: usize,
        l: &LayerWeights,
        n: usize,
        pass: Pass,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        let nd = n * c.n_embd;
        let s = &mut self.s;
        rms_norm_rows(&s.x, l.ffn_norm.f32s(f), c.rms_eps, c.n_embd, n, &mut s.xn);
        self.routes.guess.clear();
        let next = m.weights.layers.get(li + 1);
        if let Some((next, router)) = next.and_then(|nl| Some((nl, moe::Router::of(nl, f)?))) {
            // A decoded token's next experts, guessed now so that they can be read meanwhile.
            if n == 1
                && pass != Pass::Prompt
                && self.store.experts().is_some_and(|x| x.prefetches())
            {
                // The next router's input, up to a positive factor (which picks the same).
                let norm = match &next.expert_norms {
                    Some(norms) => Some(norms.router_scale.f32s(f)),
                    None => (!c.route_before_attention).then(|| next.ffn_norm.f32s(f)),
                };
                let (s, guess) = (&mut self.s, &mut self.routes.guess);
                moe::guess_next(&self.ks, c, li, norm, &router, s, guess);
            }
        }
        let s = &mut self.s;
        if l.post_ffn_norm.is_none() && c.residual_scale == 1.0 {
            return self.ffn_output(li, l, n, pass, observer);
        }
        // Every FFN path adds into the stream: run it on zeros to get the output alone, then
        // norm it and scale it as the layer says.
        grow(&mut s.resid, nd).copy_from_slice(&s.x[..nd]);
        s.x[..nd].fill(0.0);
        self.ffn_output(li, l, n, pass, observer)?;
        let s = &mut self.s;
        for (x, r) in s.x[..nd]
            .chunks_exact_mut(c.n_embd)
            .zip(s.resid.chunks_exact(c.n_embd))
        {
            if let Some(post) = &l.post_ffn_norm {
                rms_norm_in_place(x, post.f32s(f), c.rms_eps);
            }
            x.iter_mut()
                .zip(r)
                .for_each(|(x, r)| *x = *x * c.residual_scale + r);
        }
        Ok(())
    }

    /// Layer `li`'s FFN of `s.xn`, added to `s.x`: a decoded token of a sparse model runs the
    /// sparse pipeline (on the chosen experts, for a mixture); a batch runs the whole
    /// matrices the store gives (per chosen expert), dense or masked sparse.
    fn ffn_output<'o>(
        &mut self,
        li: usize,
        l: &LayerWeights,
        n: usize,
        pass: Pass,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let prompt = pass == Pass::Prompt;
        let decode_batch = pass == Pass::Decode;
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        if let Some(router) = moe::Router::of(l, f) {
            return self.mixture(li, l, router, n, pass, observer);
        }
        // A converted layer held whole runs dense where that is faster (no predictor). From an
        // offload's pinned rows it computes what the sparse step would (the layer's threshold),
        // except for a prompt batch, which runs dense as a staged layer's would.
        if let Some(d) = self.store.dense_ffn(li) {
            let as_decode =
                !prompt && (n == 1 || decode_batch || self.sparse.is_some_and(|sp| sp.batches_too));
            let threshold = (self.sparse.filter(|_| as_decode)).map(|sp| sp.layers[li].threshold);
            ffn::dense_converted(&self.ks, c.ffn_act, &d, threshold, &mut self.s, n);
            if !prompt {
                self.stats.dense_token_layers += n as u64;
            }
            return Ok(());
        }
        if self.sparse.is_some() && n == 1 && !prompt {
            return self.sparse_token(li, l, &[(li, 1.0)], pass);
        }
        let through_cache = (self.store.offload()).is_none_or(|o| o.batch_through_cache(li, n));
        if self.sparse.is_some() && decode_batch && through_cache {
            // A checked draft: each token through the decode step's own pipeline (its logits
            // are its step's, bit for bit); under a budget the neurons one token reads stay
            // cached for the next, so the batch reads about the union of what its tokens need.
            let d = self.model.config.n_embd;
            for t in 0..n {
                swap_rows(&mut self.s, t, d);
                let done = self.sparse_token(li, l, &[(li, 1.0)], pass);
                swap_rows(&mut self.s, t, d);
                done?;
            }
            return Ok(());
        }
        // A dense layer is its model's unit `li * n_expert` (a mixture's leading dense layers).
        let ne = c.n_expert.max(1);
        let next = (li + 1 < c.n_layer).then_some((li + 1) * ne);
        let mats = self.store.ffn(li * ne, next)?;
        if let Some(sp) = self.sparse.filter(|sp| sp.batches_too || decode_batch) {
            let sl = &sp.layers[li];
            let dense_bytes = [mats.gate, mats.up, mats.down]
                .iter()
                .map(|w| w.bytes().len() as u64)
                .sum();
            // The store's down matrix when it is transposed (staged), else the sparse layer's.
            let down_t = match mats.down_transposed {
                true => mats.down,
                false => sl.down_t.mat(),
            };
            if decode_batch {
                // A checked draft whose layer was staged whole (cheaper than its tokens' misses):
                // each token through the decode step's own pipeline on the staged rows, so it
                // computes what its one-token step computes, bit for bit (the batch kernel sums
                // in another order: greedy text could flip at a near tie).
                let step = Step {
                    ks: &self.ks,
                    act: c.ffn_act,
                    sparse: sp,
                    use_predictor: sp.use_predictor,
                    cluster: self.cluster,
                    layer: li,
                    units: &[(li, 1.0)],
                    dense_bytes,
                    resident_only: false,
                };
                let mut rows = Mapped::with_rows([mats.gate, mats.up, down_t], li, sp, c.n_ff);
                let d = c.n_embd;
                for t in 0..n {
                    swap_rows(&mut self.s, t, d);
                    let done = crate::pipeline::token(
                        &step,
                        &mut self.s,
                        &mut self.step,
                        &mut rows,
                        &mut self.stats,
                        None,
                    );
                    swap_rows(&mut self.s, t, d);
                    done?;
                }
                return Ok(());
            }
            ffn::sparse_batch(
                &self.ks,
                &mut self.s,
                &mut self.stats,
                li,
                n,
                sl,
                sp.use_predictor,
                [mats.gate, mats.up, down_t],
                dense_bytes,
                c.ffn_act,
            );
            return Ok(());
        }
        let transposed = mats.down_transposed;
        ffn::dense(
            &self.ks,
            c.ffn_act,
            [mats.gate, mats.up, mats.down],
            transposed,
            &mut self.s,
            observer,
            li,
            n,
        );
        Ok(())
    }

    /// Mixture layer `li`'s FFN: the tokens routed (unless they were before attention), their
    /// chosen experts (a decoded token of a sparse model: as units of the sparse step), then
    /// the shared expert where the layer has one.
    fn mixture<'o>(
        &mut self,
        li: usize,
        l: &LayerWeights,
        router: moe::Router<'_>,
        n: usize,
        pass: Pass,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        if let Some(norms) = &l.expert_norms {
            return self.mixture_beside_dense(li, l, norms, router, n, observer);
        }
        if !c.route_before_attention {
            let (s, routes) = (&mut self.s, &mut self.routes);
            moe::route_tokens(&self.ks, c, li, &router, RouterInput::Normed, s, routes, n);
            if let Some(factors) = &l.expert_scale {
                routes.scale(factors.f32s(f));
            }
        }
        if n == 1 && self.sparse.is_some() && pass != Pass::Prompt {
            let units: Vec<(usize, f32)> = (self.routes.picked.iter())
                .map(|&(e, w)| (li * c.n_expert + e, w))
                .collect();
            self.sparse_token(li, l, &units, pass)?;
        } else {
            let biases =
                (l.expert_biases.as_ref()).map(|b| [&b[0], &b[1], &b[2]].map(|t| t.f32s(f)));
            let (s, store) = (&mut self.s, self.store.as_mut());
            moe::experts(&self.ks, c, li, &self.routes, biases, s, store, observer)?;
        }
        if let Some(sh) = &l.shared {
            let mats = [&sh.gate, &sh.up, &sh.down].map(|t| t.mat(f));
            let gate = sh.gate_inp.as_ref().map(|g| g.f32s(f));
            moe::shared(&self.ks, c, mats, gate, &mut self.s, n);
        }
        Ok(())
    }

    /// Gemma 4's mixture layer (see [`pi2_model::ExpertNorms`]): its experts and the dense FFN
    /// beside them, each normed before and after, summed. The layer has a post-FFN norm, so
    /// this runs with `s.x` zeroed and the stream set aside in `s.resid`.
    fn mixture_beside_dense<'o>(
        &mut self,
        li: usize,
        l: &LayerWeights,
        norms: &pi2_model::ExpertNorms,
        router: moe::Router<'_>,
        n: usize,
        observer: Option<&mut (dyn FfnObserver + Send + 'o)>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (c, f) = (&m.config, &m.file);
        let (d, eps) = (c.n_embd, c.rms_eps);
        debug_assert!(l.post_ffn_norm.is_some(), "the FFN runs on zeros");
        let stream = std::mem::take(&mut self.s.resid);
        let s = &mut self.s;
        moe::scaled_router_input(c, norms.router_scale.f32s(f), &stream, n, &mut s.xn);
        let routes = &mut self.routes;
        moe::route_tokens(&self.ks, c, li, &router, RouterInput::Normed, s, routes, n);
        if let Some(factors) = &l.expert_scale {
            routes.scale(factors.f32s(f));
        }
        rms_norm_rows(&stream, norms.pre_experts.f32s(f), eps, d, n, &mut s.xn);
        let experts = moe::experts(
            &self.ks,
            c,
            li,
            routes,
            None,
            s,
            self.store.as_mut(),
            observer,
        );
        let s = &mut self.s;
        s.resid = stream;
        experts?;
        // The experts' sum, normed, set aside; then the dense FFN on zeros.
        let post = norms.post_experts.f32s(f);
        s.x[..n * d]
            .chunks_exact_mut(d)
            .for_each(|r| rms_norm_in_place(r, post, eps));
        grow(&mut s.att, n * d).copy_from_slice(&s.x[..n * d]);
        s.x[..n * d].fill(0.0);
        rms_norm_rows(&s.resid, l.ffn_norm.f32s(f), eps, d, n, &mut s.xn);
        let dense = l
            .shared
            .as_ref()
            .expect("a Gemma 4 mixture layer has its dense FFN");
        let mats = [&dense.gate, &dense.up, &dense.down].map(|t| t.mat(f));
        moe::shared(&self.ks, c, mats, None, s, n);
        let post = norms.post_dense.f32s(f);
        for (x, e) in s.x[..n * d].chunks_exact_mut(d).zip(s.att.chunks_exact(d)) {
            rms_norm_in_place(x, post, eps);
            x.iter_mut().zip(e).for_each(|(x, e)| *x += e);
        }
        Ok(())
    }

    /// The sparse pipeline for the decoded token: `units` of layer `li` with their weights.
    fn sparse_token(
        &mut self,
        li: usize,
        l: &LayerWeights,
        units: &[(usize, f32)],
        pass: Pass,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let f = &m.file;
        let sp = self.sparse.expect("sparse weights are set");
        let step = Step {
            ks: &self.ks,
            act: m.config.ffn_act,
            sparse: sp,
            use_predictor: sp.use_predictor,
            cluster: self.cluster,
            layer: li,
            units,
            dense_bytes: l.gate.bytes(f) + l.up.bytes(f) + l.down.bytes(f),
            resident_only: pass == Pass::Resident,
        };
        self.store.sparse_token(SparseCall {
            step: &step,
            s: &mut self.s,
            buffers: &mut self.step,
            stats: &mut self.stats,
            record: self.record.as_mut(),
            sparse: sp,
        })
    }
}

/// Swaps token row `t` of the residual stream and its normalized copy with row 0 (the row a
/// one-token step reads and adds to).
pub(super) fn swap_rows(s: &mut crate::scratch::Scratch, t: usize, d: usize) {
    if t == 0 {
        return;
    }
    for v in [&mut s.x, &mut s.xn] {
        let (first, rest) = v.split_at_mut(t * d);
        first[..d].swap_with_slice(&mut rest[..d]);
    }
}
