"""specbench against its peers, interleaved: HF assisted generation (hf_assisted.py), and the runtimes'
peers on one GGUF pair (runtimes.py) with llama.cpp's speculative example (llama_speculative.py).
"""
