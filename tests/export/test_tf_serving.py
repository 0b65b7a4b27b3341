"""dare_tf.export.tf_serving: models.config lists every export (a user's own config merged),
and model names stay inside the export base."""

import os
import re

import pytest




def test_model_config_lists_every_export_and_the_stand_in_reads_it(tmp_path):
    from dare_tf.export import write_server_configs
    from dare_tf.testing.model_config import read_model_config

    from dare_tf.export.tf_serving import model_base

    for name in ("dare", "retrieval"):
        os.makedirs(os.path.join(model_base(str(tmp_path), name), "1"))
    os.makedirs(tmp_path / "notes")  # no numeric version: not a model
    os.makedirs(tmp_path / "photos" / "2023")  # numbered, but not exported by us: not a model
    write_server_configs(str(tmp_path))
    assert read_model_config(str(tmp_path / "models.config")) == {
        "dare": str(tmp_path / "dare"), "retrieval": str(tmp_path / "retrieval")}
    escaping = tmp_path / "escaping.config"
    escaping.write_text("model_config_list { config { name: 'x' base_path: '/models/../../etc' } }")
    with pytest.raises(ValueError, match="escaping.config: model 'x': base_path '/models/../../etc' leaves the "
                                         "mounted directory"):
        read_model_config(str(escaping))
    bad = tmp_path / "bad.config"
    bad.write_text("model_config_list { config { name: 'a' base_path: '/x' } config { name: 'a' base_path: '/y' } }")
    with pytest.raises(ValueError, match="bad.config: model 'a' is listed twice"):
        read_model_config(str(bad))
    bad.write_text("model_config_list { nonsense: 1 }")
    with pytest.raises(ValueError, match="bad.config: not a TF Serving model config"):
        read_model_config(str(bad))
    bad.write_text("")
    with pytest.raises(ValueError, match="bad.config: lists no model"):
        read_model_config(str(bad))


def test_export_names_stay_inside_the_export_base_and_a_users_models_config_is_merged(tmp_path):
    from dare_tf.export import write_server_configs
    from dare_tf.export.tf_serving import model_base
    from dare_tf.testing.model_config import read_model_config

    base = tmp_path / "exports"
    for bad in ("../escaped", "a'b", "", ".", "..", "a/b", ".hidden", "dare\n"):
        with pytest.raises(ValueError, match=f"^model_name={re.escape(repr(bad))}: a model name is letters, "):
            model_base(str(base), bad)
    assert not (tmp_path / "escaped").exists()
    os.makedirs(base / "theirs" / "7")
    users = ("# the team's models (our old model_config_list { ... } moved to a.config)\nmodel_config_list {\n"
             "  config {\n    name: 'theirs'  # was: } in model_config_list {\n"
             "    base_path: '/models/theirs'\n    model_platform: 'tensorflow'\n"
             "    model_version_policy { specific { versions: 7 } }\n  }\n}\n")
    (base / "models.config").write_text(users)
    (base / "batching_parameters.txt").write_text("max_batch_size { value: 32 }\n")
    os.makedirs(os.path.join(model_base(str(base), "dare"), "1"))
    # Issue 45 (10, 11): the server's own files, and a user's directory, are no model name.
    for name in ("models.config", "batching_parameters.txt"):
        with pytest.raises(ValueError, match=f"^model_name='{name}': the name of the server's file that serving.export "
                                             f"writes beside the models in {base}; pick another name$"):
            model_base(str(base), name)
    with pytest.raises(ValueError, match=f"^model_name='theirs': {base / 'theirs'} exists and was not written by "
                                         "serving.export \\(no .dare_tf_export in it\\); nothing of it is replaced: "
                                         "pick another name or --export_base$"):
        model_base(str(base), "theirs")
    assert sorted(os.listdir(base / "theirs")) == ["7"]
    write_server_configs(str(base))
    merged = (base / "models.config").read_text()
    assert merged.startswith(users[:users.rindex("}")]) and merged.endswith("}\n")  # theirs kept byte for byte
    assert read_model_config(str(base / "models.config")) == {"theirs": str(base / "theirs"),
                                                              "dare": str(base / "dare")}
    assert "specific { versions: 7 }" in merged
    assert (base / "batching_parameters.txt").read_text() == "max_batch_size { value: 32 }\n"  # hand-written: kept
    from dare_tf.signatures import MAX_BATCH_SIZE
    from dare_tf.testing.model_config import BatchingParameters, read_batching_parameters

    # the stand-in's limit from it; TF Serving's default for a field left out: no padding
    assert read_batching_parameters(str(base / "batching_parameters.txt")) == BatchingParameters(32, False, 0)
    os.makedirs(tmp_path / "fresh")
    write_server_configs(str(tmp_path / "fresh"))
    assert read_batching_parameters(str(tmp_path / "fresh" / "batching_parameters.txt")) == BatchingParameters(
        MAX_BATCH_SIZE, True, 1000)  # ours: the stand-in's defaults
    write_server_configs(str(base))  # again: nothing to add, nothing changes
    assert (base / "models.config").read_text() == merged
    (base / "models.config").write_text("nonsense {")
    with pytest.raises(ValueError, match="models.config: not a TF Serving model config"):
        write_server_configs(str(base))


def test_a_models_config_in_angle_brackets_is_merged_into(tmp_path):
    """Issue 45 (11): text format also writes a message as `< ... >`; such a
    models.config was refused as holding no model_config_list."""
    from dare_tf.export import write_server_configs
    from dare_tf.export.tf_serving import model_base
    from dare_tf.testing.model_config import read_model_config

    base = tmp_path / "exports"
    os.makedirs(base)
    theirs = 'model_config_list <\n  config < name: "theirs" base_path: "/models/theirs" >\n>\n'
    (base / "models.config").write_text(theirs)
    os.makedirs(os.path.join(model_base(str(base), "dare"), "1"))
    write_server_configs(str(base))
    assert (base / "models.config").read_text().startswith(theirs[:theirs.rindex(">")])
    assert read_model_config(str(base / "models.config")) == {"theirs": str(base / "theirs"),
                                                              "dare": str(base / "dare")}
