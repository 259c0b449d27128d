from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("role", "mode", "boot_epoch", "max_prompt_tokens", "context_window", "page_size", "num_pages")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    BOOT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    role: str
    mode: str
    boot_epoch: int
    max_prompt_tokens: int
    context_window: int
    page_size: int
    num_pages: int
    def __init__(self, role: _Optional[str] = ..., mode: _Optional[str] = ..., boot_epoch: _Optional[int] = ..., max_prompt_tokens: _Optional[int] = ..., context_window: _Optional[int] = ..., page_size: _Optional[int] = ..., num_pages: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("tenant", "prompt_tokens", "max_tokens", "request_id", "retry")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    max_tokens: int
    request_id: str
    retry: bool
    def __init__(self, tenant: _Optional[str] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., max_tokens: _Optional[int] = ..., request_id: _Optional[str] = ..., retry: _Optional[bool] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id", "reason", "attempt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reason: str
    attempt: int
    def __init__(self, request_id: _Optional[str] = ..., reason: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PrefillSubmitRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "room", "prompt_tokens", "peer_epoch", "attempt", "decode_instance")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PEER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    room: int
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    peer_epoch: int
    attempt: int
    decode_instance: int
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., room: _Optional[int] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., peer_epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., decode_instance: _Optional[int] = ...) -> None: ...

class PrefillSubmitResponse(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("request_id", "room", "generation", "page_ids", "token", "prompt_tokens", "transfer_endpoint", "transfer_base", "transfer_slot_bytes", "attempt", "decode_instance")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_BASE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_SLOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    room: int
    generation: int
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    token: bytes
    prompt_tokens: int
    transfer_endpoint: str
    transfer_base: int
    transfer_slot_bytes: int
    attempt: int
    decode_instance: int
    def __init__(self, request_id: _Optional[str] = ..., room: _Optional[int] = ..., generation: _Optional[int] = ..., page_ids: _Optional[_Iterable[int]] = ..., token: _Optional[bytes] = ..., prompt_tokens: _Optional[int] = ..., transfer_endpoint: _Optional[str] = ..., transfer_base: _Optional[int] = ..., transfer_slot_bytes: _Optional[int] = ..., attempt: _Optional[int] = ..., decode_instance: _Optional[int] = ...) -> None: ...

class GrantAck(_message.Message):
    __slots__ = ("boot_epoch",)
    BOOT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    boot_epoch: int
    def __init__(self, boot_epoch: _Optional[int] = ...) -> None: ...

class Abort(_message.Message):
    __slots__ = ("request_id", "room", "generation", "token", "attempt", "decode_instance")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    room: int
    generation: int
    token: bytes
    attempt: int
    decode_instance: int
    def __init__(self, request_id: _Optional[str] = ..., room: _Optional[int] = ..., generation: _Optional[int] = ..., token: _Optional[bytes] = ..., attempt: _Optional[int] = ..., decode_instance: _Optional[int] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DecodeSubmitRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "room", "prompt_tokens", "max_tokens", "peer_epoch", "attempt", "prefill_instance")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PEER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PREFILL_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    room: int
    prompt_tokens: int
    max_tokens: int
    peer_epoch: int
    attempt: int
    prefill_instance: int
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., room: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., peer_epoch: _Optional[int] = ..., attempt: _Optional[int] = ..., prefill_instance: _Optional[int] = ...) -> None: ...

class DecodeSubmitResponse(_message.Message):
    __slots__ = ("request_id", "tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class PageWrite(_message.Message):
    __slots__ = ("request_id", "room", "generation", "token", "message_id", "page_ids", "digests", "page_shape", "dtype", "data", "landed", "attempt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LANDED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    room: int
    generation: int
    token: bytes
    message_id: int
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    digests: _containers.RepeatedScalarFieldContainer[bytes]
    page_shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    data: bytes
    landed: bool
    attempt: int
    def __init__(self, request_id: _Optional[str] = ..., room: _Optional[int] = ..., generation: _Optional[int] = ..., token: _Optional[bytes] = ..., message_id: _Optional[int] = ..., page_ids: _Optional[_Iterable[int]] = ..., digests: _Optional[_Iterable[bytes]] = ..., page_shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ..., landed: _Optional[bool] = ..., attempt: _Optional[int] = ...) -> None: ...

class WriteSummary(_message.Message):
    __slots__ = ("pages_accepted",)
    PAGES_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    pages_accepted: int
    def __init__(self, pages_accepted: _Optional[int] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("request_id", "room", "generation", "token", "page_count", "digest", "attempt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    room: int
    generation: int
    token: bytes
    page_count: int
    digest: bytes
    attempt: int
    def __init__(self, request_id: _Optional[str] = ..., room: _Optional[int] = ..., generation: _Optional[int] = ..., token: _Optional[bytes] = ..., page_count: _Optional[int] = ..., digest: _Optional[bytes] = ..., attempt: _Optional[int] = ...) -> None: ...

class CompletionVerdict(_message.Message):
    __slots__ = ("validated",)
    VALIDATED_FIELD_NUMBER: _ClassVar[int]
    validated: bool
    def __init__(self, validated: _Optional[bool] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("request_id", "room", "code", "reason", "attempt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    room: int
    code: str
    reason: str
    attempt: int
    def __init__(self, request_id: _Optional[str] = ..., room: _Optional[int] = ..., code: _Optional[str] = ..., reason: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class RejectionAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AbortAck(_message.Message):
    __slots__ = ("request_id", "room", "generation", "token", "attempt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROOM_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    room: int
    generation: int
    token: bytes
    attempt: int
    def __init__(self, request_id: _Optional[str] = ..., room: _Optional[int] = ..., generation: _Optional[int] = ..., token: _Optional[bytes] = ..., attempt: _Optional[int] = ...) -> None: ...

class AbortAckResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
