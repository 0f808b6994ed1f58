def normalize_for_speech(text: str, language: str = "auto") -> str:
    return text
