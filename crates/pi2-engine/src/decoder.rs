//! What a generation runs on: an [`Engine`] with the one sequence its KV cache holds, or one
//! sequence of an engine several share ([`crate::SharedSequence`]). [`crate::generate_scored`]
//! and the drafters take either.

use crate::engine::{Engine, Logits};
use crate::EngineError;
use pi2_model::{Model, TokenId};

/// A model and one sequence's context, run forward token by token or in batches.
pub trait Decoder<'m> {
    fn model(&self) -> &'m Model;
    /// Positions the context may hold.
    fn n_ctx(&self) -> usize;
    /// Tokens the context holds.
    fn n_past(&self) -> usize;
    /// See [`Engine::truncate`].
    fn truncate(&mut self, n: usize) -> usize;
    /// See [`Engine::release`].
    fn release(&mut self);
    /// See [`Engine::prepare`].
    fn prepare(&mut self);
    /// See [`Engine::reset_stats`].
    fn reset_stats(&mut self);
    /// See [`Engine::checks_batches_as_decode`].
    fn checks_batches_as_decode(&self) -> bool;
    /// See [`Engine::forward`].
    fn forward(&mut self, tokens: &[TokenId], want: Logits) -> Result<&[f32], EngineError>;
    /// See [`Engine::forward_prompt`].
    fn forward_prompt(&mut self, tokens: &[TokenId]) -> Result<&[f32], EngineError>;
    /// See [`Engine::forward_decode`].
    fn forward_decode(&mut self, tokens: &[TokenId], want: Logits) -> Result<&[f32], EngineError>;
    /// See [`Engine::forward_resident`].
    fn forward_resident(&mut self, token: TokenId) -> Result<&[f32], EngineError>;
}

impl<'m> Decoder<'m> for Engine<'m> {
    fn model(&self) -> &'m Model {
        Engine::model(self)
    }

    fn n_ctx(&self) -> usize {
        Engine::n_ctx(self)
    }

    fn n_past(&self) -> usize {
        Engine::n_past(self)
    }

    fn truncate(&mut self, n: usize) -> usize {
        Engine::truncate(self, n)
    }

    fn release(&mut self) {
        Engine::release(self)
    }

    fn prepare(&mut self) {
        Engine::prepare(self)
    }

    fn reset_stats(&mut self) {
        Engine::reset_stats(self)
    }

    fn checks_batches_as_decode(&self) -> bool {
        Engine::checks_batches_as_decode(self)
    }

    fn forward(&mut self, tokens: &[TokenId], want: Logits) -> Result<&[f32], EngineError> {
        Engine::forward(self, tokens, want)
    }

    fn forward_prompt(&mut self, tokens: &[TokenId]) -> Result<&[f32], EngineError> {
        Engine::forward_prompt(self, tokens)
    }

    fn forward_decode(&mut self, tokens: &[TokenId], want: Logits) -> Result<&[f32], EngineError> {
        Engine::forward_decode(self, tokens, want)
    }

    fn forward_resident(&mut self, token: TokenId) -> Result<&[f32], EngineError> {
        Engine::forward_resident(self, token)
    }
}
