"""Hostile and broken torch.export (``.pt2``) archives, made byte by byte: payload configs that lie about
records, offsets, sizes and dtypes, huge shapes, missing records, pickled payloads that would run code."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any, Callable

from ckptfs.errors import CorruptCheckpointError, NotACheckpointError, UnsupportedError
from hostile.cases import FLOATS, Env, case, inert, reads
from hostile.containers import zip_checkpoint
from hostile.payloads import PAYLOADS
from hostile.picklegen import i, ints, pickle, storage_pid, tensor_v2

ROOT = "model"


def meta(path_name: str = "weight_0", dtype: Any = 7, sizes: Any = (4,), strides: Any = (1,), offset: Any = 0,
         **extra: Any) -> dict[str, Any]:
    """A raw tensor's PayloadMeta as torch.export.save writes it (sizes/strides/offset as SymInts)."""
    def symints(values: Any) -> Any:
        return [{"as_int": v} for v in values] if isinstance(values, tuple) else values

    tensor_meta = {"dtype": dtype, "sizes": symints(sizes), "requires_grad": False,
                   "device": {"type": "cpu", "index": None}, "strides": symints(strides),
                   "storage_offset": {"as_int": offset} if isinstance(offset, int) else offset, "layout": 7}
    tensor_meta.update(extra.pop("tensor_meta", {}))
    return {"path_name": path_name, "is_param": True, "use_pickle": False, "tensor_meta": tensor_meta, **extra}


def pt2(weights: Any = None, records: dict[str, bytes] | None = None, constants: Any = None,
        top: dict[str, bytes] | None = None, drop: tuple[str, ...] = ()) -> bytes:
    """An archive_version 0 archive: one model, its configs (a dict becomes ``{"config": …}`` JSON; bytes are
    written as they are), the given records under ``data/``, and ``top`` records beside ``archive_format``."""
    def config(value: Any) -> bytes:
        return value if isinstance(value, bytes) else json.dumps({"config": value}).encode()

    members = {"archive_format": b"pt2", "archive_version": b"0", "byteorder": b"little",
               "models/model.json": b"{}",
               "data/weights/model_weights_config.json": config({"w": meta()} if weights is None else weights),
               "data/constants/model_constants_config.json": config({} if constants is None else constants),
               **({"data/weights/weight_0": FLOATS} if records is None else records), **(top or {})}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            if name not in drop:
                z.writestr(f"{ROOT}/{name}", data)
    return buffer.getvalue()


def _build(*args: Any, **kwargs: Any) -> Callable[[Env], bytes]:
    return lambda env: pt2(*args, **kwargs)


def _opaque_payload(name: str) -> Callable[[Env], bytes]:
    """An opaque constant whose ``pickle.dumps`` record would run a command under ``pickle.loads``."""
    return lambda env: pt2({}, constants={"obj": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                                                  "tensor_meta": None}},
                           records={"data/constants/opaque_obj_0": PAYLOADS[name].build(str(env.canary))})


def _pickled_weight_payload(name: str) -> Callable[[Env], bytes]:
    """A subclass weight (``use_pickle``) whose torch.save archive's pickle would run a command."""
    return lambda env: pt2({"w": {**meta(), "use_pickle": True}},
                           records={"data/weights/weight_0": zip_checkpoint(PAYLOADS[name].build(str(env.canary)))})


def _legacy(records: dict[str, bytes]) -> Callable[[Env], bytes]:
    def build(env: Env) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            for name, data in records.items():
                z.writestr(name, data)
        return buffer.getvalue()

    return build


HUGE = 2**40
case("pt2_plain", "pt2", _build(), check=reads({(ROOT, "weights", "w"): FLOATS}))
case("pt2_stride_negative", "pt2", _build({"w": meta(sizes=(2,), strides=(-1,))}), CorruptCheckpointError,
     r"'w': tensor stride \(-1,\) has a negative entry")
case("pt2_offset_lies", "pt2", _build({"w": meta(offset=1)}), CorruptCheckpointError,
     r"'w': tensor of size \(4,\), stride \(1,\), offset 1 \(float32\) needs 20 bytes but storage "
     r"'data/weights/weight_0' holds 16")
case("pt2_size_lies", "pt2", _build({"w": meta(sizes=(5,))}), CorruptCheckpointError, r"needs 20 bytes .* holds 16")
case("pt2_stride_lies", "pt2", _build({"w": meta(sizes=(2, 2), strides=(HUGE, 1))}), CorruptCheckpointError,
     r"needs \d+ bytes but storage 'data/weights/weight_0' holds 16")
case("pt2_huge_shape", "pt2", _build({"w": meta(sizes=(HUGE, HUGE, HUGE), strides=(0, 0, 0))}),
     CorruptCheckpointError, r"more than 2\*\*62 elements")
case("pt2_huge_expanded", "pt2", _build({"w": meta(sizes=(HUGE, 4), strides=(0, 1))}),
     check=lambda ck: ck.tensors[0].nbytes == HUGE * 16 and ck.read(ck.tensors[0], 0, 32) == FLOATS * 2)
case("pt2_size_beyond_int64", "pt2", _build({"w": meta(sizes=(2**64,), strides=(0,))}), CorruptCheckpointError,
     r"beyond int64")
case("pt2_rank_huge", "pt2", _build({"w": meta(sizes=(1,) * 100, strides=(1,) * 100)}), CorruptCheckpointError,
     r"not a list of at most 64 dimensions")
case("pt2_size_not_int", "pt2", _build({"w": meta(sizes=[{"as_int": "4"}])}), CorruptCheckpointError,
     r"'w' has size \{'as_int': '4'\}, not \{\"as_int\": N\}")
case("pt2_size_bool", "pt2", _build({"w": meta(sizes=[{"as_int": True}])}), CorruptCheckpointError,
     r"not \{\"as_int\": N\}")
case("pt2_size_symbolic", "pt2", _build({"w": meta(sizes=[{"as_expr": {"expr_str": "s0", "hint": 4}}])}),
     UnsupportedError, r"'w' has a symbolic size")
case("pt2_offset_negative", "pt2", _build({"w": meta(offset=-1)}), CorruptCheckpointError, r"negative storage offset")
case("pt2_dtype_unknown", "pt2", _build({"w": meta(dtype=99)}), CorruptCheckpointError, r"unknown dtype code 99")
case("pt2_dtype_string", "pt2", _build({"w": meta(dtype="float32")}), CorruptCheckpointError,
     r"unknown dtype code 'float32'")
case("pt2_dtype_lies", "pt2", _build({"w": meta(dtype=5, sizes=(2,))}, records={"data/weights/weight_0": FLOATS[:12]}),
     CorruptCheckpointError, r"record 'data/weights/weight_0' holds 12 bytes, not a whole number of int64 elements")
case("pt2_dtype_two_views", "pt2", _build({"a": meta(), "b": meta(dtype=4)}), CorruptCheckpointError,
     r"'b' views record 'data/weights/weight_0' as int32, another entry as float32")
case("pt2_record_missing", "pt2", _build({"w": meta(path_name="weight_7")}), CorruptCheckpointError,
     r"'w' is stored in record 'data/weights/weight_7', which is missing")
case("pt2_record_traversal", "pt2", _build({"w": meta(path_name="../../archive_format")}), CorruptCheckpointError,
     r"record 'data/weights/\.\./\.\./archive_format', which is missing")
case("pt2_config_missing", "pt2", _build(drop=("data/weights/model_weights_config.json",)), CorruptCheckpointError,
     r"model 'model' has no data/weights/model_weights_config\.json")
case("pt2_config_not_json", "pt2", _build(b"{\"config\": "), CorruptCheckpointError,
     r"model_weights_config\.json is not valid JSON")
case("pt2_config_deep", "pt2", _build(b"[" * 100_000 + b"]" * 100_000), CorruptCheckpointError,
     r"model_weights_config\.json is not valid JSON")
case("pt2_config_not_object", "pt2", _build(b"[1, 2]"), CorruptCheckpointError,
     r"model_weights_config\.json is \[1, 2\], not a JSON object")
case("pt2_config_no_config", "pt2", _build(b"{\"other\": {}}"), CorruptCheckpointError, r"has no \"config\" object")
case("pt2_meta_not_dict", "pt2", _build({"w": 3}), CorruptCheckpointError, r"'w' is 3, not a payload description")
case("pt2_meta_no_tensor_meta", "pt2", _build({"w": {**meta(), "tensor_meta": None}}), CorruptCheckpointError,
     r"'w' is a raw tensor without tensor_meta")
case("pt2_use_pickle_string", "pt2", _build({"w": {**meta(), "use_pickle": "yes"}}), CorruptCheckpointError,
     r"use_pickle 'yes', not true or false")
case("pt2_device_bad", "pt2", _build({"w": meta(tensor_meta={"device": {"type": "../x", "index": None}})}),
     CorruptCheckpointError, r"'w' has device")
case("pt2_pickled_not_zip", "pt2", _build({"w": {**meta(), "use_pickle": True}}), CorruptCheckpointError,
     r"record 'data/weights/weight_0' \(a torch\.save archive\): ")
case("pt2_pickled_tensor", "pt2",
     _build({"w": {**meta(), "use_pickle": True}},
            records={"data/weights/weight_0": zip_checkpoint(pickle(i(7)))}),
     check=lambda ck: ck.root == {ROOT: {"weights": {"w": 7}, "constants": {}}})
case("pt2_version_other", "pt2", _build(top={"archive_version": b"1"}), UnsupportedError,
     r"archive_version '1'; ckptfs reads version 0")
case("pt2_format_other", "pt2", _build(top={"archive_format": b"onnx"}), NotACheckpointError,
     r"archive_format record says 'onnx', not a torch\.export archive")
case("pt2_no_models", "pt2", _build(drop=("models/model.json",)), CorruptCheckpointError,
     r"a torch\.export archive without any models/<name>\.json")
case("pt2_aoti_so", "pt2", _build(drop=("models/model.json",),
                                  top={"data/aotinductor/model/c0.wrapper.so": b"\x7fELF" + bytes(60)}),
     UnsupportedError, r"an AOTInductor package whose weights are compiled into its shared library "
                       r"\(data/aotinductor/model/c0\.wrapper\.so\): ckptfs cannot read them")
AOTI_LIBRARY = {"data/aotinductor/model/c0.wrapper.so": b"\x7fELF" + bytes(60)}


def _aoti(config: Any, weight: bytes) -> Callable[[Env], bytes]:
    return _build(drop=("models/model.json",), records={"data/weights/weight_0": weight},
                  top={**AOTI_LIBRARY, "data/aotinductor/model/weights_config.json": json.dumps(config).encode()})


AOTI_TENSOR = zip_checkpoint(pickle(tensor_v2(storage_pid("FloatStorage", "0", 4), i(0), ints(4), ints(1))),
                             {"0": FLOATS})
case("pt2_aoti_weights", "pt2", _aoti({"w": ["weight_0", [2], [2], 1]}, AOTI_TENSOR),
     check=reads({(ROOT, "weights", "w"): FLOATS[4:8] + FLOATS[12:16]}))
case("pt2_aoti_offset_lies", "pt2", _aoti({"w": ["weight_0", [2], [2], 3]}, AOTI_TENSOR), CorruptCheckpointError,
     r"weights_config\.json: 'w': tensor of size \(2,\), stride \(2,\), offset 3 \(float32\) needs 24 bytes")
case("pt2_aoti_spec_bad", "pt2", _aoti({"w": ["weight_0", [2]]}, AOTI_TENSOR), CorruptCheckpointError,
     r"'w' is \['weight_0', \[2\]\], not \[file, sizes, strides, offset\]")
case("pt2_aoti_not_a_tensor", "pt2", _aoti({"w": ["weight_0", [1], [1], 0]}, zip_checkpoint(pickle(i(3)))),
     CorruptCheckpointError, r"'w': its file holds 3, not a tensor with data")
case("pt2_aoti_file_missing", "pt2", _aoti({"w": ["weight_9", [1], [1], 0]}, AOTI_TENSOR), CorruptCheckpointError,
     r"'w' is stored in record 'data/weights/weight_9', which is missing")
case("pt2_legacy_no_state_dict", "pt2", _legacy({"serialized_exported_program.json": b"{}",
                                                  "serialized_constants.pt": zip_checkpoint(pickle(i(1)))}),
     CorruptCheckpointError, r"torch ≤ 2\.7 without serialized_state_dict\.pt")
case("pt2_legacy_state_dict_garbage", "pt2", _legacy({"serialized_exported_program.json": b"{}",
                                                       "serialized_state_dict.pt": b"garbage",
                                                       "serialized_constants.pt": zip_checkpoint(pickle(i(1)))}),
     CorruptCheckpointError, r"record 'serialized_state_dict\.pt' \(a torch\.save archive\)")
for _name in ("os_system", "stack_global_proto4", "builtins_eval"):
    case(f"exec_{_name}_pt2_opaque", "exec", _opaque_payload(_name), check=inert(*PAYLOADS[_name].names,
                                                                                  shows="canary"))
    case(f"exec_{_name}_pt2_pickled_weight", "exec", _pickled_weight_payload(_name),
         check=inert(*PAYLOADS[_name].names, shows="canary"))
