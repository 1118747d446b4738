"""VT-Visual-v0's building blocks (the env id is not registered yet).

- :mod:`~vt_envs.domains.visual.bbox`: the bbox conventions (pixels,
  normalized, qwen1000), stated and never guessed;
- :mod:`~vt_envs.domains.visual.ops`: the image operations of the tools
  (crop, zoom, rotate, flip, grayscale, contrast) on read-only arrays;
- :mod:`~vt_envs.domains.visual.scenes`: procedural V*-style scenes with
  small targets and known answers;
- :mod:`~vt_envs.domains.visual.image_tokens`: how many tokens an image costs
  a Qwen2-VL-style policy (the processor's smart resize, reproduced);
- :mod:`~vt_envs.domains.visual.tools`: the JSON-called image tools over an
  episode's image list (by index; results appended);
- :mod:`~vt_envs.domains.visual.tasks`: seeded scene tasks and ``ChoiceMatch``;
- :mod:`~vt_envs.domains.visual.loaders`: the V* bench layout.
"""
