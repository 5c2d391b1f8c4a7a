"""Servers we start and watch: process groups, the vLLM server and its processes, the engines and the tiny
models, crash watching."""
