"""specctl: self-speculative decoding for Llama-family LLMs (batched, lossless).

    from specctl import Generator
    outputs = Generator(model="smollm2-135m-instruct", method="self-draft").generate(["Hi!"])
"""

__version__ = "0.1.0"

__all__ = ["GenerationOutput", "Generator", "SpecctlError", "__version__"]


def __getattr__(name: str):
    # lazily: `import specctl.errors` & co. must not load torch and the whole runtime
    if name in ("Generator", "GenerationOutput"):
        from specctl.runtime.jobs import generator
        return getattr(generator, name)
    if name == "SpecctlError":   # (what every mistake the API reports is)
        from specctl.errors import SpecctlError
        return SpecctlError
    raise AttributeError(f"module 'specctl' has no attribute {name!r}")
