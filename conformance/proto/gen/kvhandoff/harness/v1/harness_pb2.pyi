from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("name", "fine_grained", "modes", "event_log_version", "retries", "instances")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINE_GRAINED_FIELD_NUMBER: _ClassVar[int]
    MODES_FIELD_NUMBER: _ClassVar[int]
    EVENT_LOG_VERSION_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    name: str
    fine_grained: bool
    modes: _containers.RepeatedScalarFieldContainer[str]
    event_log_version: int
    retries: bool
    instances: bool
    def __init__(self, name: _Optional[str] = ..., fine_grained: _Optional[bool] = ..., modes: _Optional[_Iterable[str]] = ..., event_log_version: _Optional[int] = ..., retries: _Optional[bool] = ..., instances: _Optional[bool] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("config_json", "mode", "shortfall")
    class ShortfallEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SHORTFALL_FIELD_NUMBER: _ClassVar[int]
    config_json: str
    mode: str
    shortfall: _containers.ScalarMap[int, int]
    def __init__(self, config_json: _Optional[str] = ..., mode: _Optional[str] = ..., shortfall: _Optional[_Mapping[int, int]] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("session", "request_ids")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    session: str
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session: _Optional[str] = ..., request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SessionRef(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InstanceRef(_message.Message):
    __slots__ = ("session", "prefill_instance", "decode_instance")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PREFILL_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    session: str
    prefill_instance: int
    decode_instance: int
    def __init__(self, session: _Optional[str] = ..., prefill_instance: _Optional[int] = ..., decode_instance: _Optional[int] = ...) -> None: ...

class RequestRef(_message.Message):
    __slots__ = ("session", "request")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    session: str
    request: int
    def __init__(self, session: _Optional[str] = ..., request: _Optional[int] = ...) -> None: ...

class Performed(_message.Message):
    __slots__ = ("performed",)
    PERFORMED_FIELD_NUMBER: _ClassVar[int]
    performed: bool
    def __init__(self, performed: _Optional[bool] = ...) -> None: ...

class DeliverRequest(_message.Message):
    __slots__ = ("session", "kind", "request", "page", "attempt")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    session: str
    kind: str
    request: int
    page: int
    attempt: int
    def __init__(self, session: _Optional[str] = ..., kind: _Optional[str] = ..., request: _Optional[int] = ..., page: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class MessageRef(_message.Message):
    __slots__ = ("session", "kind", "request", "attempt")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    session: str
    kind: str
    request: int
    attempt: int
    def __init__(self, session: _Optional[str] = ..., kind: _Optional[str] = ..., request: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("session", "attack", "request")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ATTACK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    session: str
    attack: str
    request: int
    def __init__(self, session: _Optional[str] = ..., attack: _Optional[str] = ..., request: _Optional[int] = ...) -> None: ...

class ProbeResponse(_message.Message):
    __slots__ = ("performed", "outcome", "changed", "detail")
    PERFORMED_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    performed: bool
    outcome: str
    changed: bool
    detail: str
    def __init__(self, performed: _Optional[bool] = ..., outcome: _Optional[str] = ..., changed: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class EventsResponse(_message.Message):
    __slots__ = ("headers", "events")
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    headers: _containers.RepeatedScalarFieldContainer[str]
    events: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, headers: _Optional[_Iterable[str]] = ..., events: _Optional[_Iterable[str]] = ...) -> None: ...

class PageRead(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class ForeignCanary(_message.Message):
    __slots__ = ("writer", "tenant")
    WRITER_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    writer: str
    tenant: str
    def __init__(self, writer: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ("request", "ok", "code", "message", "read", "foreign")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_FIELD_NUMBER: _ClassVar[int]
    request: int
    ok: bool
    code: str
    message: str
    read: _containers.RepeatedCompositeFieldContainer[PageRead]
    foreign: _containers.RepeatedCompositeFieldContainer[ForeignCanary]
    def __init__(self, request: _Optional[int] = ..., ok: _Optional[bool] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., read: _Optional[_Iterable[_Union[PageRead, _Mapping]]] = ..., foreign: _Optional[_Iterable[_Union[ForeignCanary, _Mapping]]] = ...) -> None: ...

class AnswersResponse(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[Answer]
    def __init__(self, answers: _Optional[_Iterable[_Union[Answer, _Mapping]]] = ...) -> None: ...

class PageContent(_message.Message):
    __slots__ = ("page", "writer")
    PAGE_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    page: int
    writer: str
    def __init__(self, page: _Optional[int] = ..., writer: _Optional[str] = ...) -> None: ...

class PageContentsResponse(_message.Message):
    __slots__ = ("known", "pages")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    known: bool
    pages: _containers.RepeatedCompositeFieldContainer[PageContent]
    def __init__(self, known: _Optional[bool] = ..., pages: _Optional[_Iterable[_Union[PageContent, _Mapping]]] = ...) -> None: ...

class QuiescentResponse(_message.Message):
    __slots__ = ("quiescent",)
    QUIESCENT_FIELD_NUMBER: _ClassVar[int]
    quiescent: bool
    def __init__(self, quiescent: _Optional[bool] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...
