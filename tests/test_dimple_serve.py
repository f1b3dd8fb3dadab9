"""Dimple with pictures through the OpenAI-compatible server: pictures in chat messages (data URLs), as LLaDA-V's;
the answer is the service's for the same request, and usage counts each picture at its own token count."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
from dimple_checkpoint import picture, write_dimple

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.seer.options import SeerOptions
from seer_deploy.serve import BackgroundServer, ServeOptions, create_app, protocol
from seer_deploy.service import Service, ServiceOptions

CONFIG = GenerationConfig(gen_length=16, steps=16)


def data_url(width: int, height: int, seed: int) -> str:
    png = io.BytesIO()
    picture(width, height, seed).save(png, format="PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


def test_pictures_in_chat_messages_get_the_services_answer(tmp_path: Path) -> None:
    path, _, _ = write_dimple(tmp_path)
    service = Service(str(path), ServiceOptions(generation=CONFIG, seer=SeerOptions(on=False)))
    body = {"model": "dimple", "max_tokens": CONFIG.gen_length, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(100, 60, 0)}}, {"type": "text", "text": "what is"},
        {"type": "image_url", "image_url": {"url": data_url(200, 90, 1)}}, {"type": "text", "text": "the answer"}]}]}
    request = protocol.parse(protocol.ChatBody, json.dumps(body).encode())
    assert isinstance(request, protocol.ChatBody)
    prepared = service.prepare([request.request()])
    images = service.info.images
    assert images is not None and len(prepared.pictures[0]) == 2
    tokens = [images.picture_tokens(p) for p in prepared.pictures[0]]
    assert tokens[0] != tokens[1]  # each picture at its own size
    assert prepared.prompt_tokens == [len(prepared.ids[0]) - 2 + sum(tokens)]
    want = service.generate([request.request()]).answers[0].text
    with BackgroundServer(create_app(service, ServeOptions(model_name="dimple", gen_lengths=(CONFIG.gen_length,)))) \
            as server:
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == want
    assert answer.json()["usage"]["prompt_tokens"] == prepared.prompt_tokens[0]


def test_a_picture_too_small_is_a_400_naming_the_parameter(tmp_path: Path) -> None:
    path, _, _ = write_dimple(tmp_path)
    service = Service(str(path), ServiceOptions(generation=CONFIG, seer=SeerOptions(on=False)))
    body = {"model": "dimple", "max_tokens": CONFIG.gen_length, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(20, 90, 0)}}, {"type": "text", "text": "what"}]}]}
    with BackgroundServer(create_app(service, ServeOptions(model_name="dimple", gen_lengths=(CONFIG.gen_length,)))) \
            as server:
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 400, answer.text
    assert "28 px" in answer.text and "param" in answer.json()["error"]
