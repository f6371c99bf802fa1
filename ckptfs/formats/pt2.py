"""torch.export ``.pt2`` archives (``torch.export.save``, ``package_pt2``), recognised by their records.

Two layouts are read, both of which torch 2.13's ``torch.export.load`` takes:

* archive_version 0 (torch ≥ 2.8): one root folder of any name (the file's
  stem when torch wrote it) holding ``archive_format`` = ``pt2``,
  ``models/<model>.json`` per exported program, and each model's weights and
  constants described by JSON payload configs (``pt2_payloads``). The
  intermediate form with one torch.save archive per model
  (``data/weights/<model>.pt``, ``data/constants/<model>.pt``) is read too.
* the layout of torch ≤ 2.7: records at the zip's top level,
  ``serialized_exported_program.json`` beside ``serialized_state_dict.pt`` and
  ``serialized_constants.pt``, torch.save archives of the state dict and the
  constants.

The tree is ``{model: {"weights": {FQN: …}, "constants": {FQN: …}}}``: FQNs
are keys as they are (``lin.weight``), never split on dots; the old layout's
one program is ``model``, as ``torch.export.save`` names it.
AOTInductor packages hold compiled models and no program: their weights kept out
of the library (``package_constants_in_so=False``) are ``{model: {"weights": …}}``;
those whose weights are compiled into the shared library are refused with an
error saying so.
"""

from __future__ import annotations

from typing import Any

from ckptfs.errors import CkptfsError, CorruptCheckpointError, NotACheckpointError, UnsupportedError
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.formats.pt2_payloads import PayloadLoader
from ckptfs.formats.zip_archive import ZipArchive
from ckptfs.formats.zip_checkpoint import ZipParsed
from ckptfs.limits import Limits
from ckptfs.model.records import Storage
from ckptfs.pickle.values import short_repr

ARCHIVE_FORMAT = "archive_format"
ARCHIVE_VERSION = "archive_version"
MODELS_DIR = "models/"
WEIGHTS_DIR = "data/weights/"
CONSTANTS_DIR = "data/constants/"
AOTI_DIR = "data/aotinductor/"
AOTI_CONFIG = "/weights_config.json"
AOTI_CONFIG_DEPTH = 3
"""``data/aotinductor/<model>/weights_config.json``: the weights an AOTInductor model keeps out of its library."""
EXTRA_DIR = "extra/"
LEGACY_PROGRAM = "serialized_exported_program.json"
LEGACY_STATE_DICT = "serialized_state_dict.pt"
LEGACY_CONSTANTS = "serialized_constants.pt"
MAX_SMALL_RECORD = 4096
LEGACY_MODEL = "model"


class Pt2Zip(ZipArchive):
    """A zip whose records lie under one root folder, or at its top level in torch ≤ 2.7's ``.pt2`` layout.

    Any zip is parsed as one (its central directory once), then ``is_pt2`` tells which reader takes it: for a
    zip that is not a ``.pt2`` it is exactly a ``ZipArchive``.
    """

    def _find_prefix(self) -> str:
        if LEGACY_PROGRAM in self.entries:
            return ""
        return super()._find_prefix()


def is_pt2(archive: Pt2Zip) -> bool:
    """Whether the zip's records are a ``.pt2``'s: an ``archive_format`` record under its root folder, or the old
    layout's top-level program."""
    return archive.prefix == "" or archive.entry(ARCHIVE_FORMAT) is not None


def open_pt2(archive: Pt2Zip, limits: Limits) -> ParsedCheckpoint:
    """The ``.pt2`` archive (``is_pt2``) read."""
    if archive.prefix == "":
        return _open_legacy(archive, limits)
    return _open_archive(archive, limits)


def _open_archive(archive: ZipArchive, limits: Limits) -> ParsedCheckpoint:
    names = [name[len(archive.prefix):] for name in archive.entries]
    models = [name[len(MODELS_DIR):-len(".json")] for name in names
              if name.startswith(MODELS_DIR) and name.endswith(".json") and "/" not in name[len(MODELS_DIR):]]
    # The JSON configs stand in for the pickle of a torch.save archive, and are held to the same size limit.
    configs = {f"{directory}{model}_{kind}_config.json": limits.max_pickle_bytes
               for model in models for directory, kind in ((WEIGHTS_DIR, "weights"), (CONSTANTS_DIR, "constants"))}
    compiled = {} if models else {name: limits.max_pickle_bytes for name in names if name.startswith(AOTI_DIR)
                                  and name.endswith(AOTI_CONFIG) and name.count("/") == AOTI_CONFIG_DEPTH}
    records = archive.read_records({ARCHIVE_FORMAT: MAX_SMALL_RECORD, ARCHIVE_VERSION: MAX_SMALL_RECORD,
                                    "byteorder": MAX_SMALL_RECORD, **configs, **compiled})
    archive_format = records[ARCHIVE_FORMAT].decode("utf-8", "replace").strip()
    if archive_format != "pt2":
        raise NotACheckpointError(f"a zip archive whose archive_format record says {short_repr(archive_format)}, "
                                  "not a torch.export archive (pt2)")
    version = records.get(ARCHIVE_VERSION, b"0").decode("utf-8", "replace").strip()
    if version != "0":
        raise UnsupportedError(f"a torch.export archive of archive_version {short_repr(version)}; "
                               "ckptfs reads version 0")
    loader = PayloadLoader(archive, limits)
    if models:
        root = {model: _program(archive, loader, records, model) for model in models}
        layout = "torch.export archive_version 0"
    elif compiled:
        root = {name[len(AOTI_DIR):].partition("/")[0]: {"weights": loader.load_aoti(records[name], name)}
                for name in compiled}
        layout = "AOTInductor package, weights outside its library"
    else:
        raise _no_models(names)
    loader.finish()
    details = {
        "archive_prefix": archive.prefix.rstrip("/"),
        "records": len(archive.entries),
        "layout": layout,
        "models": ", ".join(root),
        "byteorder_record": records["byteorder"].decode("utf-8", "replace").strip() if "byteorder" in records
        else None,
        "extra_files": ", ".join(name[len(EXTRA_DIR):] for name in names if name.startswith(EXTRA_DIR)) or None,
    }
    return _parsed(archive, limits, loader, root, details)


def _program(archive: ZipArchive, loader: PayloadLoader, records: dict[str, bytes], model: str) -> dict[str, Any]:
    """One exported program's weights and constants: from its payload configs, or one torch.save archive each."""
    program: dict[str, Any] = {}
    for key, directory in (("weights", WEIGHTS_DIR), ("constants", CONSTANTS_DIR)):
        blob = archive.entry(f"{directory}{model}.pt")
        config = f"{directory}{model}_{key}_config.json"
        if blob is not None:
            loader.defer(program, key, blob)
        elif config in records:
            program[key] = loader.load(records[config], config, directory)
        else:
            raise CorruptCheckpointError(f"model {model!r} has no {config} (nor {directory}{model}.pt)")
    return program


def _no_models(names: list[str]) -> CkptfsError:
    """What an archive without exported programs or weight files is: an AOTInductor package, or broken."""
    if any(name.startswith(AOTI_DIR) for name in names):
        libraries = [name for name in names if name.startswith(AOTI_DIR) and name.endswith(".so")]
        where = f" ({libraries[0]})" if libraries else ""
        return UnsupportedError(
            "an AOTInductor package whose weights are compiled into its shared library"
            f"{where}: ckptfs cannot read them (aot_inductor.package_constants_in_so=False keeps them as files)")
    return CorruptCheckpointError("a torch.export archive without any models/<name>.json")


def _open_legacy(archive: ZipArchive, limits: Limits) -> ParsedCheckpoint:
    loader = PayloadLoader(archive, limits)
    program: dict[str, Any] = {}
    for key, record in (("weights", LEGACY_STATE_DICT), ("constants", LEGACY_CONSTANTS)):
        entry = archive.entry(record)
        if entry is None:
            raise CorruptCheckpointError(f"a torch.export archive of torch ≤ 2.7 without {record}")
        loader.defer(program, key, entry)
    loader.finish()
    records = archive.read_records({"version": MAX_SMALL_RECORD})
    details = {
        "records": len(archive.entries),
        "layout": "torch.export archive of torch <= 2.7 (no root folder)",
        "models": LEGACY_MODEL,
        "schema_version": records["version"].decode("utf-8", "replace").strip() if "version" in records else None,
    }
    return _parsed(archive, limits, loader, {LEGACY_MODEL: program}, details)


def _parsed(archive: ZipArchive, limits: Limits, loader: PayloadLoader, root: Any,
            details: dict[str, Any]) -> ParsedCheckpoint:
    storages = [*loader.storages.values(), *loader.embedded_storages]
    archive.finish_opening()
    return Pt2Parsed("pt2", root, storages, "little", details, archive=archive, limits=limits)


class Pt2Parsed(ZipParsed):
    def verify(self, storage: Storage) -> None:
        """A record of the archive: its local header checked once; a storage of an embedded torch.save archive
        (its record ``outer/inner``) was checked when that archive was opened."""
        if self.archive.entry(storage.record) is not None:
            super().verify(storage)
