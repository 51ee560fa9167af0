"""A repetitive offline job (issue 55): synthetic short documents each asked for the same JSON
fields, the same documents again under a second instruction (a second pass over one corpus),
and rewrite-this-sentence requests. Everything is made here from fixed word lists and a seeded
generator: no downloaded text.

    python recipes/job_workload.py --docs 128 > recipes/prompts/job-repetitive.jsonl

Lines are `{"id", "category", "prompt"}` in job order: the extraction pass, the second pass,
then the rewrites.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

FIRST = ["Anna", "Ben", "Clara", "David", "Elena", "Felix", "Grace", "Hugo", "Iris", "Jonas",
         "Karin", "Leo", "Maya", "Nils", "Olga", "Paul", "Rosa", "Sam", "Tara", "Victor"]
LAST = ["Berg", "Costa", "Dietz", "Evans", "Fischer", "Garcia", "Hansen", "Ivanova", "Jensen",
        "Kowalski", "Lindqvist", "Moreau", "Novak", "Olsen", "Petrov", "Quinn", "Rossi", "Silva"]
JOBS = ["nurse", "carpenter", "teacher", "software engineer", "baker", "pilot", "accountant",
        "architect", "chemist", "librarian", "electrician", "journalist"]
FIRMS = ["Northwind Ltd", "Bluebird Foods", "Harbor Logistics", "Greenfield Energy",
         "Summit Health", "Redstone Builders", "Clearwater Labs", "Oakridge Press"]
CITIES = ["Lisbon", "Oslo", "Lyon", "Krakow", "Dublin", "Porto", "Utrecht", "Graz", "Turku",
          "Bilbao", "Ghent", "Aarhus"]
HOBBIES = ["plays the violin", "runs marathons", "grows tomatoes", "collects old maps",
           "builds model ships", "paints landscapes", "climbs mountains", "keeps bees"]

EXTRACT = ("Read the document and return a JSON object with the keys \"name\", \"occupation\", "
           "\"employer\", \"city\" and \"year_joined\". Return only the JSON.\n\nDocument: {doc}")
SECOND = ("Read the document and return a JSON object with the keys \"person\", \"job\", "
          "\"hobby\" and \"summary\" (one sentence). Return only the JSON.\n\nDocument: {doc}")
REWRITE = "Rewrite this sentence in simpler words, keeping its meaning: {s}"

SENTENCES = [
    "The {job} from {city} said that the new schedule at {firm} would start next {day}.",
    "According to the report, {firm} plans to open a second office in {city} before {month}.",
    "Because of the heavy rain in {city}, the meeting with the {job} was moved to {day}.",
    "Residents of {city} were informed that {firm} will reduce its prices starting in {month}.",
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
MONTHS = ["March", "April", "June", "September", "November"]


def document(rng: random.Random) -> str:
    name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    job, firm, city = rng.choice(JOBS), rng.choice(FIRMS), rng.choice(CITIES)
    year = rng.randint(1995, 2024)
    return (f"{name} is a {job} who lives in {city}. {name.split()[0]} joined {firm} in {year} "
            f"and {rng.choice(HOBBIES)} on weekends.")


def sentence(rng: random.Random) -> str:
    return rng.choice(SENTENCES).format(job=rng.choice(JOBS), city=rng.choice(CITIES),
                                        firm=rng.choice(FIRMS), day=rng.choice(DAYS),
                                        month=rng.choice(MONTHS))


def lines(docs: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    ds = [document(rng) for _ in range(docs)]
    out = [{"id": f"extract-{i}", "category": "extract", "prompt": EXTRACT.format(doc=d)}
           for i, d in enumerate(ds)]
    out += [{"id": f"second-{i}", "category": "second", "prompt": SECOND.format(doc=d)}
            for i, d in enumerate(ds)]
    out += [{"id": f"rewrite-{i}", "category": "rewrite",
             "prompt": REWRITE.format(s=sentence(rng))} for i in range(docs)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for line in lines(a.docs, a.seed):
        sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
