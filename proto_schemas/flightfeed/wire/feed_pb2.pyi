from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Shuffle(_message.Message):
    __slots__ = ("enabled", "block_rows", "buffer_rows")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ROWS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_ROWS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    block_rows: int
    buffer_rows: int
    def __init__(self, enabled: _Optional[bool] = ..., block_rows: _Optional[int] = ..., buffer_rows: _Optional[int] = ...) -> None: ...

class ReadCommand(_message.Message):
    __slots__ = ("version", "dataset", "columns", "seed", "epoch", "shuffle", "rank", "world_size", "batch_rows", "drop_last", "streams", "start_row", "global_start", "worker", "num_workers", "fingerprint", "transforms", "compression", "message_rows", "transform", "on_decode_error", "with_index", "pack", "views")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    DROP_LAST_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    START_ROW_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_START_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TRANSFORMS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ROWS_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    ON_DECODE_ERROR_FIELD_NUMBER: _ClassVar[int]
    WITH_INDEX_FIELD_NUMBER: _ClassVar[int]
    PACK_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    version: int
    dataset: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    epoch: int
    shuffle: Shuffle
    rank: int
    world_size: int
    batch_rows: int
    drop_last: bool
    streams: int
    start_row: int
    global_start: int
    worker: int
    num_workers: int
    fingerprint: str
    transforms: _containers.RepeatedScalarFieldContainer[str]
    compression: str
    message_rows: int
    transform: _containers.RepeatedCompositeFieldContainer[TransformStep]
    on_decode_error: str
    with_index: bool
    pack: Pack
    views: bool
    def __init__(self, version: _Optional[int] = ..., dataset: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., epoch: _Optional[int] = ..., shuffle: _Optional[_Union[Shuffle, _Mapping]] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., batch_rows: _Optional[int] = ..., drop_last: _Optional[bool] = ..., streams: _Optional[int] = ..., start_row: _Optional[int] = ..., global_start: _Optional[int] = ..., worker: _Optional[int] = ..., num_workers: _Optional[int] = ..., fingerprint: _Optional[str] = ..., transforms: _Optional[_Iterable[str]] = ..., compression: _Optional[str] = ..., message_rows: _Optional[int] = ..., transform: _Optional[_Iterable[_Union[TransformStep, _Mapping]]] = ..., on_decode_error: _Optional[str] = ..., with_index: _Optional[bool] = ..., pack: _Optional[_Union[Pack, _Mapping]] = ..., views: _Optional[bool] = ...) -> None: ...

class Pack(_message.Message):
    __slots__ = ("column", "seq_len", "pad_tail", "pad_id")
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    PAD_TAIL_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    column: str
    seq_len: int
    pad_tail: bool
    pad_id: int
    def __init__(self, column: _Optional[str] = ..., seq_len: _Optional[int] = ..., pad_tail: _Optional[bool] = ..., pad_id: _Optional[int] = ...) -> None: ...

class TransformStep(_message.Message):
    __slots__ = ("name", "column", "params_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    column: str
    params_json: str
    def __init__(self, name: _Optional[str] = ..., column: _Optional[str] = ..., params_json: _Optional[str] = ...) -> None: ...

class SkipInfo(_message.Message):
    __slots__ = ("positions", "skipped")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    positions: int
    skipped: int
    def __init__(self, positions: _Optional[int] = ..., skipped: _Optional[int] = ...) -> None: ...

class StreamTicket(_message.Message):
    __slots__ = ("version", "read", "fingerprint", "num_rows", "start_row", "end_row", "message_rows", "first_message", "message_step", "expected_rows", "stream_index", "stored_order", "message_count")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    START_ROW_FIELD_NUMBER: _ClassVar[int]
    END_ROW_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ROWS_FIELD_NUMBER: _ClassVar[int]
    FIRST_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_STEP_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ROWS_FIELD_NUMBER: _ClassVar[int]
    STREAM_INDEX_FIELD_NUMBER: _ClassVar[int]
    STORED_ORDER_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    version: int
    read: ReadCommand
    fingerprint: str
    num_rows: int
    start_row: int
    end_row: int
    message_rows: int
    first_message: int
    message_step: int
    expected_rows: int
    stream_index: int
    stored_order: bool
    message_count: int
    def __init__(self, version: _Optional[int] = ..., read: _Optional[_Union[ReadCommand, _Mapping]] = ..., fingerprint: _Optional[str] = ..., num_rows: _Optional[int] = ..., start_row: _Optional[int] = ..., end_row: _Optional[int] = ..., message_rows: _Optional[int] = ..., first_message: _Optional[int] = ..., message_step: _Optional[int] = ..., expected_rows: _Optional[int] = ..., stream_index: _Optional[int] = ..., stored_order: _Optional[bool] = ..., message_count: _Optional[int] = ...) -> None: ...

class ClientReport(_message.Message):
    __slots__ = ("client_id", "dataset", "rank", "world_size", "stall_ratio", "rows_per_s", "bytes_per_s", "rows_total", "bytes_total", "wait_s", "elapsed_s", "device", "nodes")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    STALL_RATIO_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    ROWS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    dataset: str
    rank: int
    world_size: int
    stall_ratio: float
    rows_per_s: float
    bytes_per_s: float
    rows_total: int
    bytes_total: int
    wait_s: float
    elapsed_s: float
    device: str
    nodes: int
    def __init__(self, client_id: _Optional[str] = ..., dataset: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., stall_ratio: _Optional[float] = ..., rows_per_s: _Optional[float] = ..., bytes_per_s: _Optional[float] = ..., rows_total: _Optional[int] = ..., bytes_total: _Optional[int] = ..., wait_s: _Optional[float] = ..., elapsed_s: _Optional[float] = ..., device: _Optional[str] = ..., nodes: _Optional[int] = ...) -> None: ...
