"""Type stubs for pi2's native module (Rust, PyO3)."""

from typing import Dict, List, Optional, Sequence, Tuple, Union

# (role, content, calls as (id, name, arguments JSON), tool_call_id, name, reasoning_content)
PyMessage = Tuple[str, str, Sequence[Tuple[str, str, str]], Optional[str], Optional[str], Optional[str]]

__version__: str

class Pi2Error(RuntimeError):
    """pi2 could not do what was asked: the message says why and what to do."""

def catalogue() -> List[Tuple[str, str, int, str]]:
    """(name, file, size in bytes, licence) of each model `pi2.Model` fetches by name."""

class TextStream:
    """Text pieces of a running generation; closing it stops the generation."""
    def __iter__(self) -> "TextStream": ...
    def __next__(self) -> Union[str, Tuple[str, str]]:
        """A piece of text, or with log probabilities asked for, (text, JSON of its tokens'
        OpenAI chat `logprobs.content` entries)."""
    def close(self) -> None: ...
    @property
    def finish_reason(self) -> Optional[str]: ...
    @property
    def stats(self) -> Optional[Dict[str, float]]: ...

class Request:
    """How a generation samples and stops (checked when made)."""
    def __init__(
        self,
        max_tokens: int = 256,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        seed: Optional[int] = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        draft_max: int = 0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Sequence[Tuple[int, float]] = (),
        grammar: Optional[str] = None,
        json_schema: Optional[str] = None,
        logprobs: Optional[int] = None,
        calls_grammar: Optional[str] = None,
        chat: bool = False,
    ) -> None: ...

class AnswerReader:
    """A chat answer read in its template's dialect: reasoning, content and calls."""
    def push(self, text: str) -> Tuple[str, str]: ...
    def finish(self) -> Tuple[str, str, List[Tuple[str, str]]]: ...

def calls_grammar(functions: Sequence[Tuple[str, Optional[str]]], parallel: bool) -> str:
    """The Lark grammar a required call is held to."""

class NativeModel:
    def __init__(
        self,
        model: Optional[str] = None,
        mem_budget: Optional[str] = None,
        plan: Optional[str] = None,
        threads: Optional[int] = None,
        cores: Optional[str] = None,
        n_ctx: int = 4096,
        n_batch: Optional[int] = None,
        verbose: bool = False,
    ) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def offloaded(self) -> bool: ...
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> List[int]: ...
    def detokenize(self, tokens: Sequence[int]) -> str: ...
    def apply_chat_template(self, messages: Sequence[PyMessage], add_generation_prompt: bool = True,
                            tools: Optional[str] = None) -> str: ...
    def chat_tokens(self, messages: Sequence[PyMessage], tools: Optional[str] = None) -> List[int]: ...
    def answer_reader(self, prompt: Sequence[int], reasoning_format: str = "auto",
                      tools: Optional[Sequence[str]] = None) -> AnswerReader: ...
    def generate_tokens(self, tokens: Sequence[int], request: Request) -> Tuple[str, str, Dict[str, float], Optional[str]]: ...
    def stream_tokens(self, tokens: Sequence[int], request: Request) -> TextStream: ...
    def stats(self) -> Optional[Dict[str, float]]: ...
    def reset(self) -> None: ...
    def embed_tokens(self, tokens: Sequence[int], pooling: str = "mean") -> List[float]: ...
