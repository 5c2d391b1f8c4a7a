"""mmchaos: load and chaos testing for vLLM multimodal embedding servers."""
