"""Writes examples/answers/: the default target's own answers (token ids), the data the shipped head
is trained on (docs/training.md).

Two stages, each sharded and resumable (a shard is written once, atomically; a rerun skips it), each
run given a time budget so that it fits between other jobs:

    python examples/make_answers.py requests --minutes 9   # the target writes requests (sampled)
    python examples/make_answers.py prompts                # filter, de-duplicate, compose: prompts.jsonl
    python examples/make_answers.py answers --minutes 9    # greedy + sampled answers to all prompts

Conversations take a second turn: the target writes what the user says next after one
of its own finished answers, and answers that in context.

    python examples/make_answers.py followups --minutes 9      # the user's next message (sampled)
    python examples/make_answers.py conversations              # compose: conversations.jsonl
    python examples/make_answers.py conversations --minutes 9  # then answer them, greedy + sampled

Stage 1 asks the target (as configured: the pair's int4 default) for user requests across topics
and task types, seeded; paragraphs and sentences it writes become summarise / read-and-answer /
translate / rewrite prompts. Its replies to those requests are target text too and are kept as
answers. Stage 3 answers examples/train-prompts.jsonl (the templates) and the new prompts: greedy,
and sampled at temperature 0.8 for the new ones. No text from outside the project.

Copies are not answers: the target's own passages with some of their words swapped for
random others, shown to it with a request to repeat them, and the passage as the reply. The teacher
pass scores the target on that reply, where it copies from its context text no template made.

    python examples/make_answers.py copies

Round 2 asks again, with another seed and five more kinds of request (compare, advice,
list, email, fact), and composes long contexts from two of the target's paragraphs on one topic. Its
requests, prompts (ids ``gen2-``) and answers come after round 1's shards, which stay as they were.
Round 3 asks again with a third seed, and for a second paragraph and pair of sentences
per topic (more summarise, long-context and translate prompts, the weakest scenarios); ids ``gen3-``.

Hand-written prompts: examples/handwritten-prompts.jsonl, 832 requests written for the
project as users type them (eleven kinds of task, with texts and code of their own pasted in), none
sharing a six-word run with a prompt file heads are judged on; answered greedy and sampled, in file
order, so prompts added at the end leave the answered shards as they were.

    python examples/make_answers.py handwritten --minutes 30
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_conversation, encode_prompt
from specdec_cli.prompts import read_file
from specdec_cli.training.corpus import (
    FOLLOW_UP,
    clean_request,
    dedup_key,
    dedupe,
    finished_turns,
    read_shard,
    read_shards,
    shard_path,
    sharing_phrases,
    within_budget,
    write_shard,
)
from specdec_cli.training.distill import AnswerSettings, answer_pruned, default_target

HERE = Path(__file__).resolve().parent
OUT = HERE / "answers"
SEED = 0
SHARD = 64

TOPICS = [
    "cooking at home", "baking bread", "gardening", "house plants", "personal finance", "saving for retirement",
    "astronomy", "the solar system", "volcanoes", "ocean life", "birds", "dogs", "cats", "insects", "dinosaurs",
    "ancient Rome", "ancient Egypt", "the Middle Ages", "the industrial revolution", "world war history",
    "climate", "renewable energy", "electric cars", "public transport", "city planning", "architecture",
    "painting", "photography", "music theory", "learning the guitar", "jazz", "film making", "video games",
    "board games", "chess", "football", "running", "swimming", "yoga", "sleep", "nutrition", "first aid",
    "the human heart", "the immune system", "genetics", "chemistry in the kitchen", "electricity", "magnets",
    "computer networks", "databases", "web development", "operating systems", "cyber security", "machine learning",
    "spreadsheets", "writing emails", "job interviews", "public speaking", "time management", "studying for exams",
    "learning a language", "travel planning", "camping", "mountains", "deserts", "rivers", "weather", "recycling",
    "small businesses", "marketing", "economics", "taxes", "law and contracts", "philosophy", "psychology",
    "friendship", "parenting", "moving house", "home repairs", "bicycles", "coffee", "tea", "chocolate",
]
LANGUAGES = ["Python", "JavaScript", "Java", "C", "C++", "Go", "Rust", "SQL", "Bash", "TypeScript"]
HUMAN_LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]
MORE_LANGUAGES = ["Dutch", "Swedish", "Polish", "Turkish", "Russian", "Japanese", "Chinese"]  # round 2 adds these
KINDS = {  # what the target is asked to write; the reply is a request unless composed later
    "question": "Write one question that a curious person might ask an AI assistant about {topic}. Reply with the question only.",
    "chat": "Write a short, casual message that someone might send to a friendly chatbot about {topic}. Reply with the message only.",
    "explain": "Write a request asking an assistant to explain an idea from {topic} in simple words. Reply with the request only.",
    "howto": "Write a request asking an assistant for step-by-step instructions for a task related to {topic}. Reply with the request only.",
    "code": "Write a request asking an assistant to write a small {lang} program related to {topic}. Reply with the request only.",
    "math": "Write a short math word problem about {topic} that uses numbers. Reply with the problem only.",
    "creative": "Write a request asking an assistant for a short poem, story or slogan about {topic}. Reply with the request only.",
    "paragraph": "Write a short informative paragraph about {topic}.",
    "sentence": "Write one interesting sentence about {topic}.",
    "function": "Write a short {lang} function related to {topic}, with no explanation.",
}
NEW_KINDS = {  # round 2
    "compare": "Write a request asking an assistant to compare two things related to {topic}. Reply with the request only.",
    "advice": "Write a message in which someone asks an assistant for advice on a problem with {topic}. Reply with the message only.",
    "list": "Write a request asking an assistant for a short list of tips or ideas about {topic}. Reply with the request only.",
    "email": "Write a request asking an assistant to draft a short email or note about {topic}. Reply with the request only.",
    "fact": "Write a short factual question about {topic} that has a one-line answer. Reply with the question only.",
}
ROUNDS = {1: KINDS, 2: {**KINDS, **NEW_KINDS}}
# Round 3: another seed, and a second paragraph and sentence per topic, since summarise,
# long-context and translate are where the head accepts least on the unseen prompts.
ROUNDS[3] = {**ROUNDS[2],
             "passage": "Write a short paragraph that explains how something works in {topic}.",
             "remark": "Write two plain sentences about an everyday fact from {topic}."}
SAME_AS = {"passage": "paragraph", "remark": "sentence"}  # composed like the kind they stand for


def meta_prompts(round_: int = 1) -> list[dict]:
    rng = random.Random(SEED + round_ - 1)
    prefix = "req" if round_ == 1 else f"req{round_}"
    rows = []
    for topic in TOPICS:
        for kind, template in ROUNDS[round_].items():
            lang = rng.choice(LANGUAGES if kind == "code" else ["Python", "JavaScript", "Python", "C", "Go"])
            rows.append({"id": f"{prefix}-{kind}-{len(rows)}", "kind": kind, "topic": topic,
                         "text": template.format(topic=topic, lang=lang)})
    rng.shuffle(rows)
    return rows


def shards_of(rows: list[dict]) -> list[list[dict]]:
    return [rows[i : i + SHARD] for i in range(0, len(rows), SHARD)]


def run_shards(directory: Path, jobs: list[list[dict]], minutes: float, settings: AnswerSettings, sampled_of,
               greedy: bool = True) -> None:
    """Answer each shard of prompts not answered yet, until the budget would be overrun."""
    todo = [i for i in range(len(jobs)) if not shard_path(directory, i).is_file()]
    print(f"{len(todo)} of {len(jobs)} shards to do", flush=True)
    if not todo:
        return
    target, eos, pad = default_target()
    for index in within_budget(todo, minutes):
        began = time.monotonic()
        shard = jobs[index]
        encoded = [encode_conversation(target.tokenizer, row["messages"]) if "messages" in row
                   else encode_prompt(target.tokenizer, row["text"]) for row in shard]
        rows = []
        for sampled in (False, True) if greedy else (True,):
            chosen = [i for i, row in enumerate(shard) if (sampled_of(row) if sampled else True)]
            if not chosen:
                continue
            settings.seed = SEED + index + (100_000 if sampled else 0)
            replies = answer_pruned(target.model, [encoded[i] for i in chosen], eos, pad, sampled, settings)
            for i, reply in zip(chosen, replies):
                if reply:
                    rows.append({"id": shard[i]["id"], "kind": "sampled" if sampled else "greedy",
                                 "ids": encoded[i] + reply, "start": len(encoded[i])})
        write_shard(shard_path(directory, index), rows)
        tokens = sum(len(r["ids"]) - r["start"] for r in rows)
        print(f"shard {index}: {len(rows)} answers, {tokens} tokens, {time.monotonic() - began:.0f} s", flush=True)


def stage_requests(minutes: float) -> None:
    jobs = [job for round_ in ROUNDS for job in shards_of(meta_prompts(round_))]  # each round's shards after the last's
    settings = AnswerSettings(max_new_tokens=96, temperature=0.9, batch_size=SHARD)
    # Sampled only: variety is the point here.
    run_shards(OUT / "requests", jobs, minutes, settings, sampled_of=lambda row: True, greedy=False)


def stage_prompts() -> None:
    """Requests → prompts.jsonl: cleaned, de-duplicated (also against the template, bench and unseen
    files), round by round: round 1's prompts come out as they always did, later rounds' follow."""
    tokenizer = target_tokenizer()
    by_id = {row["id"]: row for round_ in ROUNDS for row in meta_prompts(round_)}
    replies: dict[int, dict[str, list]] = {round_: {} for round_ in ROUNDS}
    for row in read_shards(OUT / "requests"):
        if row["kind"] != "sampled":
            continue
        text = tokenizer.decode(row["ids"][row["start"] :], skip_special_tokens=True).strip()
        round_ = 1 if row["id"].startswith("req-") else int(row["id"].split("-")[0][3:])
        kind = by_id[row["id"]]["kind"]
        replies[round_].setdefault(SAME_AS.get(kind, kind), []).append((row["id"], text))
    seen = set()
    for path in (HERE / "train-prompts.jsonl", HERE.parent / "benchmarks" / "unseen-prompts.jsonl",
                 HERE.parent / "benchmarks" / "bench-prompts.jsonl"):
        seen |= {dedup_key(p.text) for p in read_file(path)}
    prompts: list[dict] = []
    paragraphs: dict[str, list[str]] = {}  # topic → the target's paragraphs so far (round 2 pairs them)
    for round_ in ROUNDS:
        compose(round_, replies[round_], by_id, seen, prompts, paragraphs)
    (OUT / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    counts = {}
    for p in prompts:
        counts[p["scenario"]] = counts.get(p["scenario"], 0) + 1
    print(f"{len(prompts)} prompts: {counts}")


def compose(round_: int, replies: dict[str, list], by_id: dict, seen: set, prompts: list[dict],
            paragraphs: dict[str, list[str]]) -> None:
    """One round's replies → prompts appended to ``prompts`` (ids gen-N in round 1, genR-N in round R)."""
    rng = random.Random(SEED + round_ - 1)
    prefix, first = ("gen" if round_ == 1 else f"gen{round_}"), len(prompts)

    def add(kind: str, text: str, source: str) -> None:
        if dedupe([text], seen):
            prompts.append({"id": f"{prefix}-{len(prompts) - first}", "prompt": text, "scenario": kind, "from": source})

    questions = []
    asking = ("question", "chat", "explain", "howto", "code", "math", "creative") + (tuple(NEW_KINDS) if round_ > 1 else ())
    for kind in asking:
        for source, text in replies.get(kind, []):
            first_part = text.split("\n\n")[0].strip()
            cleaned = clean_request(first_part)
            if cleaned:
                add(kind, cleaned, source)
                if kind in ("question", "fact"):
                    questions.append((by_id[source]["topic"], cleaned))
    for source, text in replies.get("paragraph", []):
        if clean_request(text, 150, 1500):
            topic = by_id[source]["topic"]
            asked = [q for t, q in questions if t == topic]
            earlier = paragraphs.setdefault(topic, [])
            choice = rng.random()
            if round_ > 1 and asked and earlier and choice < 0.35:
                context = "\n\n".join(rng.sample([text, earlier[0]], 2))
                add("long-context", f"{context}\n\nUsing the two texts above, answer this: {rng.choice(asked)}", source)
            elif asked and choice < 0.5:
                add("long-context", f"{text}\n\nUsing the text above, answer this: {rng.choice(asked)}", source)
            else:
                add("summarise", rng.choice(["Summarize this paragraph in two sentences:", "Give the main points of this text:",
                                            "TL;DR this for me please:"]) + f"\n\n{text}", source)
            earlier.append(text)
    languages = HUMAN_LANGUAGES + (MORE_LANGUAGES if round_ > 1 else [])
    for source, text in replies.get("sentence", []):
        sentence = clean_request(text.split("\n")[0], 20, 300)
        if sentence:
            if rng.random() < 0.6:
                add("translate", f"Translate into {rng.choice(languages)}: {sentence}", source)
            else:
                add("rewrite", rng.choice(["Rewrite this sentence in a formal tone:", "Make this sentence simpler:",
                                          "Paraphrase this:"]) + f" {sentence}", source)
    for source, text in replies.get("function", []):
        if ("def " in text or "function" in text or "{" in text) and clean_request(text, 40, 1200):
            add("code-edit", rng.choice(["Add comments to this code:", "Is there a bug in this code?",
                                        "Make this code shorter:", "Explain this code:"]) + f"\n\n{text}", source)


def target_tokenizer():
    """The default target's tokenizer, without loading the target."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_converted_dir(load_registry(None).pair(None))))


def _converted_dir(pair) -> Path:
    from specdec_cli.pairs.conversion import converted
    from specdec_cli.pairs.loading import _resolve

    directory, gguf = _resolve(pair.target.source)
    return Path(converted(pair.target.source, directory, gguf, weights=False)) if gguf else Path(directory)


def stage_answers(minutes: float) -> None:
    templates = [{"id": f"tpl-{p.id}", "text": p.text, "new": False} for p in read_file(HERE / "train-prompts.jsonl")]
    generated = [{"id": p.id, "text": p.text, "new": True} for p in read_file(OUT / "prompts.jsonl")]
    first = templates + [row for row in generated if row["id"].startswith("gen-")]
    random.Random(SEED).shuffle(first)
    jobs = shards_of(first)  # round 1's shards as they were; each later round's after them
    for round_ in list(ROUNDS)[1:]:
        later = [row for row in generated if row["id"].startswith(f"gen{round_}-")]
        random.Random(SEED + round_ - 1).shuffle(later)
        jobs += shards_of(later)
    settings = AnswerSettings(max_new_tokens=128, temperature=0.8, batch_size=SHARD)
    run_shards(OUT / "answers", jobs, minutes, settings, sampled_of=lambda row: row["new"])


CONVERSATION_SEED, FIRST_TURNS = 10, 640  # first turns: 10 shards of follow-ups
FIRST_TURN_SHARDS = 73  # the answer shards there were when the follow-ups were written; later ones add no first turn


def first_turns(tokenizer) -> list[dict]:
    """The generated prompts' greedy answers that finished, a seeded sample: the first turns."""
    texts = {p.id: p.text for p in read_file(OUT / "prompts.jsonl")}
    answers = [row for i in range(FIRST_TURN_SHARDS) for row in read_shard(shard_path(OUT / "answers", i))]
    rows = finished_turns(answers, set(texts), eos=tokenizer.eos_token_id)
    random.Random(SEED + CONVERSATION_SEED).shuffle(rows)
    turns = []
    for row in rows[:FIRST_TURNS]:
        answer = tokenizer.decode(row["ids"][row["start"] :], skip_special_tokens=True).strip()
        turns.append({"id": f"fu-{row['id']}", "first": row["id"], "question": texts[row["id"]], "answer": answer,
                      "text": FOLLOW_UP.format(question=texts[row["id"]], answer=answer)})
    return turns


def stage_followups(minutes: float) -> None:
    settings = AnswerSettings(max_new_tokens=64, temperature=0.9, batch_size=SHARD)
    run_shards(OUT / "followups", shards_of(first_turns(target_tokenizer())), minutes, settings, sampled_of=lambda row: True,
               greedy=False)


def stage_conversations(minutes: float | None) -> None:
    """Without a budget: follow-ups → conversations.jsonl (two user turns and the answer between);
    with one: answer those conversations, greedy and sampled, into answers/conversations."""
    path = OUT / "conversations.jsonl"
    if minutes is None:
        tokenizer = target_tokenizer()
        turns = {row["id"]: row for row in first_turns(tokenizer)}
        seen = {dedup_key(p.text) for p in read_file(OUT / "prompts.jsonl")}
        rows = []
        for reply in read_shards(OUT / "followups"):
            text = tokenizer.decode(reply["ids"][reply["start"] :], skip_special_tokens=True).strip()
            follow = clean_request(text.split("\n\n")[0], 10, 400)
            turn = turns[reply["id"]]
            if follow and dedupe([follow], seen):
                rows.append({"id": f"conv-{len(rows)}", "scenario": "conversation", "from": turn["first"], "messages": [
                    {"role": "user", "content": turn["question"]}, {"role": "assistant", "content": turn["answer"]},
                    {"role": "user", "content": follow}]})
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"{len(rows)} conversations from {len(turns)} first turns")
        return
    rows = [{**row, "new": True} for row in map(json.loads, path.read_text().splitlines())]
    jobs = shards_of(rows)
    if len(jobs[-1]) < SHARD and len(list((OUT / "followups").glob("shard-*"))) < -(-FIRST_TURNS // SHARD):
        jobs = jobs[:-1]  # more follow-ups to come would fill it: a written shard is never redone
    settings = AnswerSettings(max_new_tokens=128, temperature=0.8, batch_size=SHARD)
    run_shards(OUT / "conversations", jobs, minutes, settings, sampled_of=lambda row: True)


COPY_ASKS = [  # written for this stage; the passage follows the request, or comes before it
    "Repeat the following text exactly as it is written:",
    "Copy this back to me word for word, please.",
    "Here is some text. Write it out again without changing anything.",
    "Echo the passage below unchanged.",
    "Can you type out this text again for me? Keep every word.",
    "Please rewrite the text below exactly, keeping every word in its place.",
]
COPY_SHARDS, COPY_SWAP = 16, (0.15, 0.4, 1.0)  # the share of words swapped: a few names, many, word salad


def copy_rows(tokenizer, answers: list[dict], count: int, seed: int = SEED) -> list[dict]:
    """Synthetic copy tasks (seeded): a passage from one of the target's greedy answers, words swapped
    at random for words from its other answers, so that only the context can predict them."""
    rng = random.Random(seed + 15)  # a stream of its own, apart from the stages seeded SEED + round
    texts = [tokenizer.decode(r["ids"][r["start"] :], skip_special_tokens=True).strip() for r in answers if r["kind"] == "greedy"]
    words = sorted({w for text in texts for w in text.split() if w.isalpha() and len(w) > 2})
    rows = []
    for n in range(count):
        lines = rng.choice(texts).split("\n")
        first = rng.randrange(len(lines))
        kept, total = [], 0
        for line in lines[first:]:
            if total > 50:
                break
            kept.append(line)
            total += len(line.split())
        swap = COPY_SWAP[n % len(COPY_SWAP)]
        passage = "\n".join(" ".join(rng.choice(words) if rng.random() < swap and w.isalpha() else w
                                       for w in line.split(" ")) for line in kept).strip()
        if not passage:
            continue
        ask = rng.choice(COPY_ASKS)
        text = f"{ask}\n\n{passage}" if rng.random() < 0.75 else f"{passage}\n\n{ask}"
        prompt = encode_prompt(tokenizer, text)
        reply = tokenizer(passage, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append({"id": f"copy-{n}", "kind": "copy", "text": text, "ids": prompt + reply, "start": len(prompt)})
    return rows


def copy_tasks() -> list[dict]:
    """The copy tasks as ``copies`` writes them (rebuilt from the seed and the first turns' answer shards)."""
    answers = [row for i in range(FIRST_TURN_SHARDS) for row in read_shard(shard_path(OUT / "answers", i))]
    return copy_rows(target_tokenizer(), answers, COPY_SHARDS * SHARD)


def stage_copies() -> None:
    rows = copy_tasks()
    for index, shard in enumerate(shards_of(rows)):
        write_shard(shard_path(OUT / "copies", index), [{k: row[k] for k in ("id", "kind", "ids", "start")} for row in shard])
    print(f"{len(rows)} copy tasks, {sum(len(r['ids']) - r['start'] for r in rows)} reply tokens")


HANDWRITTEN = HERE / "handwritten-prompts.jsonl"
JUDGED_ON = (HERE / "equivalence-prompts.jsonl", HERE.parent / "benchmarks" / "lossy-prompts.jsonl",
             HERE.parent / "benchmarks" / "unseen-prompts.jsonl", HERE.parent / "benchmarks" / "bench-prompts.jsonl")


def handwritten_prompts() -> list:
    """The hand-written prompts, refused if any shares a six-word run with a file a head is judged on."""
    prompts = read_file(HANDWRITTEN)
    shared = sharing_phrases([p.text for p in prompts], [p.text for path in JUDGED_ON for p in read_file(path)])
    if shared:
        raise SystemExit(f"{len(shared)} of the hand-written prompts share wording with a prompt file heads are judged on, "
                         f"e.g. {shared[0][:80]!r}")
    return prompts


def stage_handwritten(minutes: float) -> None:
    # In file order: a shard of one kind of prompt pads little, and prompts added at the end (whole
    # shards of them) leave the shards already answered as they were.
    rows = [{"id": p.id, "text": p.text} for p in handwritten_prompts()]
    settings = AnswerSettings(max_new_tokens=128, temperature=0.8, batch_size=SHARD)
    run_shards(OUT / "handwritten", shards_of(rows), minutes, settings, sampled_of=lambda row: True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("requests", "prompts", "answers", "followups", "conversations", "copies",
                                                   "handwritten"))
    parser.add_argument("--minutes", type=float, default=None, help="time budget (default 9; conversations: "
                        "without it, compose them)")
    args = parser.parse_args()
    torch.manual_seed(SEED)
    minutes = 9.0 if args.minutes is None else args.minutes
    {"requests": lambda: stage_requests(minutes), "prompts": stage_prompts,
     "answers": lambda: stage_answers(minutes), "followups": lambda: stage_followups(minutes),
     "conversations": lambda: stage_conversations(args.minutes), "copies": stage_copies, "handwritten": lambda: stage_handwritten(minutes)}[args.stage]()


if __name__ == "__main__":
    sys.exit(main())
