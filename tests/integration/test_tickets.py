"""The ticket search on tiny models: a returned ticket does reproduce the answer when used as the mask."""

import pytest
import torch

from kvroute.engine.decode import DecodeSettings, decode_cells
from kvroute.engine.prefill import prefill
from kvroute.errors import ConfigError
from kvroute.models import tiny_model
from kvroute.tasks import TaskSpec, build_prompt, generate_tasks
from kvroute.tickets import TicketSettings, find_ticket


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_ticket_reproduces_the_full_answer(arch):
    lm = tiny_model(arch, seed=0)
    inst = generate_tasks(TaskSpec("base", n=1, seed=1))[0]
    ticket = find_ticket(lm, inst, settings=TicketSettings(target="full", max_new_tokens=4, batch=8, groups=8,
                                                           refine_rounds=2, max_evaluations=48))
    assert 0 < ticket.fraction < 1
    # independently decode with the ticket as the mask
    prompt = build_prompt(lm.tokenizer, inst)
    pre = prefill(lm.model, prompt.context_ids)
    full = torch.ones_like(ticket.mask.mask)
    from kvroute.presses import KeepMask

    outs = decode_cells(lm.model, lm.tokenizer, pre, prompt.question_ids, [KeepMask(full), ticket.mask],
                        settings=DecodeSettings(max_new_tokens=4))
    assert outs[1].tokens == outs[0].tokens
    s = ticket.summary()
    assert s["entries"] == ticket.size and s["evaluations"] >= 2
    assert len(s["evidence_heads_per_token"]) == len(ticket.evidence)
    # the history is the search's own record: every accepted size passed
    assert any(k == ticket.size and ok for k, ok in ticket.history) or ticket.size == s["total_entries"]


def test_bad_target():
    with pytest.raises(ConfigError, match="target"):
        TicketSettings(target="nope")


@pytest.mark.parametrize("cap", [3, 10, 25])
def test_max_evaluations_is_a_hard_cap(cap):
    lm = tiny_model("llama", seed=0)
    inst = generate_tasks(TaskSpec("base", n=1, seed=1))[0]
    ticket = find_ticket(lm, inst, settings=TicketSettings(target="full", max_new_tokens=4, batch=8, groups=8,
                                                           refine_rounds=4, max_evaluations=cap))
    assert len(ticket.history) <= cap
    prompt = build_prompt(lm.tokenizer, inst)
    pre = prefill(lm.model, prompt.context_ids)
    from kvroute.presses import KeepMask

    outs = decode_cells(lm.model, lm.tokenizer, pre, prompt.question_ids,
                        [KeepMask(torch.ones_like(ticket.mask.mask)), ticket.mask],
                        settings=DecodeSettings(max_new_tokens=4))
    assert outs[1].tokens == outs[0].tokens  # still a real ticket under a tight budget


def test_saved_ticket_round_trips_and_is_listed(tmp_path):
    from kvroute.analysis.tickets import load_tickets
    from kvroute.tickets import load_ticket_mask, save_ticket

    lm = tiny_model("qwen2", seed=0)
    inst = generate_tasks(TaskSpec("base", n=1, seed=1))[0]
    tk = find_ticket(lm, inst, settings=TicketSettings(target="full", max_new_tokens=4, batch=8, groups=8,
                                                       refine_rounds=2, max_evaluations=24))
    line = save_ticket(tmp_path, "tiny/qwen2", "full", inst.family, tk)
    save_ticket(tmp_path, "other", "full", inst.family, tk)
    stem = f"qwen2-{inst.id}"
    mask = load_ticket_mask(tmp_path / "tickets" / f"{stem}.npz")
    assert mask.shape == tuple(tk.mask.shape) and (mask == tk.mask.mask.cpu().numpy()).all()
    assert (tmp_path / "tickets" / f"{stem}.png").is_file() == bool(tk.evidence)
    df = load_tickets(tmp_path)
    assert list(df["model"]) == ["tiny/qwen2", "other"] and df["entries"].tolist() == [tk.size, tk.size]
    assert line["instance_id"] == inst.id and line["target"] == "full"


def test_ticket_counts_the_always_kept_question_suffix():
    lm = tiny_model("llama", seed=0)
    inst = generate_tasks(TaskSpec("base", n=1, seed=1))[0]
    tk = find_ticket(lm, inst, settings=TicketSettings(target="full", max_new_tokens=4, batch=8, groups=8,
                                                       refine_rounds=2, max_evaluations=24))
    prompt = build_prompt(lm.tokenizer, inst)
    L, Hkv, T = tk.mask.shape
    s = tk.summary()
    assert s["question_tokens"] == len(prompt.question_ids) > 0
    assert s["question_entries"] == L * Hkv * len(prompt.question_ids)
    expected = (tk.size + s["question_entries"]) / (L * Hkv * T + s["question_entries"])
    assert s["fraction_with_question"] == pytest.approx(expected)
    assert s["fraction_with_question"] > s["fraction"]  # the suffix is kept whole, so the full footprint is larger


def test_ticket_search_builds_the_sweeps_prompt():
    lm = tiny_model("llama", seed=0)
    inst = generate_tasks(TaskSpec("base", n=1, seed=1))[0]
    plain = build_prompt(lm.tokenizer, inst)
    prefixed = build_prompt(lm.tokenizer, inst, answer_prefix="Answer:", system_prompt="Be brief.")
    assert len(prefixed.question_ids) != len(plain.question_ids) or prefixed.context_ids != plain.context_ids
    tk = find_ticket(lm, inst, settings=TicketSettings(target="full", max_new_tokens=4, batch=8, groups=8,
                                                       refine_rounds=1, max_evaluations=12),
                     answer_prefix="Answer:", system_prompt="Be brief.")
    assert tk.mask.shape[2] == len(prefixed.context_ids)
    assert tk.question_tokens == len(prefixed.question_ids)
    s = tk.summary()
    assert s["answer_prefix"] == "Answer:" and s["system_prompt"] == "Be brief."
